"""The single controller: one driver process drives groups of worker processes through Ray.

What the trainer uses — the whole layer a newcomer needs, importable from here:

- ``DataProto``: the batch between the driver and the workers (data_proto.py; its storage tensor_batch.py,
  its joins merge.py, padding padding.py, futures future.py; all of it under verl's path protocol.py)
- ``Worker``: base class of a worker process (base/worker.py)
- ``register``, ``Dispatch``, ``Execute``: make a worker method a group method; the trainer uses
  ``Dispatch.ONE_TO_ALL`` and ``Dispatch.DP_COMPUTE_PROTO`` (base/decorator.py, base/dispatch.py)
- ``RayResourcePool``, ``RayClassWithInitArgs``: where workers run, and what they are (ray/placement.py)
- ``RayWorkerGroup``: start the workers, call them as one (ray/base.py; its method names: ray/binding.py)
- ``create_colocated_worker_cls``: several roles in one process, one view each via ``spawn`` (ray/colocate.py)
- ``WorkerDiedError``, ``shutdown_worker_group``: notice dead workers, tear a group down (ray/health.py)

Compatibility — in compat/, never used by the trainer, reachable under the seeds' and verl's import paths
(thin modules re-export it: base/megatron/, ray/megatron.py, models/): the seed tutorials' API
(``MegatronWorker``/``TensorParallelWorker``, ``NVMegatronRayWorkerGroup``, the ``MEGATRON_COMPUTE(_PROTO)``,
``DP_COMPUTE``, ``DP_COMPUTE_METRIC`` and custom dispatch modes, the tensor-parallel LLaMA MLP,
``merge_resource_pool``) and verl's beyond it (DataProto's ``reorder``/``to_tensordict``/... and the protocol
helpers, n-d mesh dispatch, ``split_resource_pool``, fused colocated classes, ``from_detached``/``fuse``,
``update_options``). What is supported and how: docs/verl_api.md.
"""

from importlib import import_module

from single_controller.protocol import DataProto, DataProtoConfig, DataProtoFuture

# Loaded on first use: `from single_controller import DataProto` must not import Ray.
_LAZY = {
    "Worker": "single_controller.base.worker",
    "register": "single_controller.base.decorator",
    "Dispatch": "single_controller.base.decorator",
    "Execute": "single_controller.base.decorator",
    "RayResourcePool": "single_controller.ray.placement",
    "RayClassWithInitArgs": "single_controller.ray.placement",
    "RayWorkerGroup": "single_controller.ray.base",
    "create_colocated_worker_cls": "single_controller.ray.colocate",
    "WorkerDiedError": "single_controller.ray.health",
    "shutdown_worker_group": "single_controller.ray.health",
}

__all__ = ["DataProto", "DataProtoConfig", "DataProtoFuture", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'single_controller' has no attribute {name!r}")
