"""The single controller: one driver process drives groups of worker processes through Ray.

What the trainer uses — the whole layer a newcomer needs, importable from here:

- ``DataProto``: the batch between the driver and the workers (data_proto.py; its storage tensor_batch.py,
  its joins merge.py, padding padding.py, futures future.py; all of it under verl's path protocol.py)
- ``Worker``: base class of a worker process (base/worker.py)
- ``register``, ``Dispatch``, ``Execute``: make a worker method a group method; the trainer uses
  ``Dispatch.ONE_TO_ALL`` and ``Dispatch.DP_COMPUTE_PROTO`` (base/register.py, base/dispatch.py)
- ``RayResourcePool``, ``RayClassWithInitArgs``: where workers run, and what they are (ray/placement.py)
- ``RayWorkerGroup``: start the workers, call them as one (ray/group.py; its method names: ray/binding.py)
- ``create_colocated_worker_cls``: several roles in one process, one view each via ``spawn`` (ray/colocate.py)
- ``WorkerDiedError``, ``shutdown_worker_group``: notice dead workers, tear a group down (ray/health.py)

Compatibility — in compat/, never used by the trainer, reachable under the seeds' and verl's import paths
(thin modules re-export it: base/megatron/, ray/megatron.py, models/): the seed tutorials' API
(``MegatronWorker``/``TensorParallelWorker``, ``NVMegatronRayWorkerGroup``, the ``MEGATRON_COMPUTE(_PROTO)``,
``DP_COMPUTE``, ``DP_COMPUTE_METRIC`` and custom dispatch modes, the tensor-parallel LLaMA MLP,
``merge_resource_pool``) and verl's beyond it (DataProto's ``reorder``/``to_tensordict``/... and the protocol
helpers, n-d mesh dispatch, ``split_resource_pool``, fused colocated classes, ``from_detached``/``fuse``,
``update_options``). What is supported and how: docs/verl_api.md.

The dependency points one way: the core never imports compat/, and adds nothing to its classes. This module and
the other verl import paths (protocol.py, base/__init__.py, base/decorator.py, ray/__init__.py, ray/base.py,
ray/megatron.py, base/megatron/, models/) give verl's classes: compat/'s subclasses of the core's (``DataProto``,
``Worker``, ``RayWorkerGroup``, ``RayClassWithInitArgs``, the colocated ``WorkerDict``) and verl's ``Dispatch`` enum
of every mode. They load on first use, so importing a core module (``single_controller.data_proto``) imports no
compat module; the trainer imports the core modules themselves.
"""

from importlib import import_module

# verl's names, loaded on first use: `import single_controller.data_proto` must import neither compat/ nor Ray
_LAZY = {
    "DataProto": "single_controller.compat.data_proto",
    "DataProtoConfig": "single_controller.padding",
    "DataProtoFuture": "single_controller.future",
    "Dispatch": "single_controller.compat.dispatch",
    "Execute": "single_controller.base.register",
    "register": "single_controller.base.register",
    "Worker": "single_controller.compat.worker",
    "RayResourcePool": "single_controller.ray.placement",
    "RayClassWithInitArgs": "single_controller.compat.placement",
    "RayWorkerGroup": "single_controller.compat.worker_group",
    "create_colocated_worker_cls": "single_controller.compat.fused",
    "WorkerDiedError": "single_controller.ray.health",
    "shutdown_worker_group": "single_controller.ray.health",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'single_controller' has no attribute {name!r}")
