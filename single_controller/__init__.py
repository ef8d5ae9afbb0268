"""The single controller: one driver process drives groups of worker processes through Ray.

What the trainer uses — the whole layer a newcomer needs, importable from here:

- ``DataProto``: the batch between the driver and the workers (protocol.py: data_proto.py, tensor_batch.py, future.py)
- ``Worker``: base class of a worker process (base/worker.py)
- ``register``, ``Dispatch``, ``Execute``: make a worker method a group method; the trainer uses
  ``Dispatch.ONE_TO_ALL`` and ``Dispatch.DP_COMPUTE_PROTO`` (base/decorator.py)
- ``RayResourcePool``, ``RayClassWithInitArgs``: where workers run, and what they are (ray/placement.py)
- ``RayWorkerGroup``: start the workers, call them as one (ray/base.py)
- ``create_colocated_worker_cls``: several roles in one process, one view each via ``spawn`` (ray/colocate.py)
- ``WorkerDiedError``, ``shutdown_worker_group``: notice dead workers, tear a group down (ray/health.py)

Seed-only — the API of the tutorials ColoRL grew from (examples/seed_*.py run their code), kept and tested
(tests/single_controller/test_seeds.py, test_megatron.py) but not used by the trainer:
``MegatronWorker``/``TensorParallelWorker`` (base/megatron/), ``NVMegatronRayWorkerGroup`` and the
``MEGATRON_COMPUTE(_PROTO)`` modes (ray/megatron.py), the tensor-parallel LLaMA MLP (models/),
``merge_resource_pool``, the ``DP_COMPUTE``, ``DP_COMPUTE_METRIC``, ``ALL_TO_ALL`` and custom dispatch modes.

verl compatibility — for worker code written against today's verl (docs/verl_api.md):
``DataProtoConfig``, ``DataProtoFuture``, ``TensorDict`` batches, ``make_nd_compute_dataproto_dispatch_fn``,
``RayWorkerGroup(name_prefix=, device_name=, detached=, worker_names=)`` and ``RayWorkerGroup.from_detached``.
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
