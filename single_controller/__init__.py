"""The single controller: one driver process drives groups of worker processes through Ray.

What the trainer uses — the whole layer a newcomer needs, importable from here:

- ``DataProto``: the batch between the driver and the workers (data_proto.py; its storage tensor_batch.py,
  its joins merge.py, padding padding.py, futures future.py)
- ``Worker``: base class of a worker process (base/worker.py)
- ``register``, ``Dispatch``, ``Execute``: make a worker method a group method; the trainer uses
  ``Dispatch.ONE_TO_ALL`` and ``Dispatch.DP_COMPUTE_PROTO`` (base/register.py, base/dispatch.py)
- ``RayResourcePool``, ``RayClassWithInitArgs``: where workers run, and what they are (ray/placement.py)
- ``RayWorkerGroup``: start the workers, call them as one (ray/group.py; its method names, dispatch and
  collect: base/worker_group.py)
- ``LocalWorkerGroup``: the same for one worker that is an object of the driver's process, without Ray (local.py)
- ``create_colocated_worker_cls``: several roles in one process, one view each via ``spawn`` (ray/colocate.py)
- ``WorkerDiedError``, ``shutdown_worker_group``: notice dead workers, tear a group down (ray/health.py)

The names load on first use, so importing ``single_controller.data_proto`` imports neither Ray nor the rest.
"""

from importlib import import_module

_LAZY = {
    "DataProto": "single_controller.data_proto",
    "DataProtoConfig": "single_controller.padding",
    "DataProtoFuture": "single_controller.future",
    "Dispatch": "single_controller.base.register",
    "Execute": "single_controller.base.register",
    "register": "single_controller.base.register",
    "Worker": "single_controller.base.worker",
    "RayResourcePool": "single_controller.ray.placement",
    "RayClassWithInitArgs": "single_controller.ray.placement",
    "RayWorkerGroup": "single_controller.ray.group",
    "LocalWorkerGroup": "single_controller.local",
    "create_colocated_worker_cls": "single_controller.ray.colocate",
    "WorkerDiedError": "single_controller.ray.health",
    "shutdown_worker_group": "single_controller.ray.health",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'single_controller' has no attribute {name!r}")
