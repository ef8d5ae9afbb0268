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

The dependency points one way: the core never imports compat/. The modules that are verl's import paths (this one,
protocol.py, base/decorator.py, ray/__init__.py, ray/base.py, ray/megatron.py, base/megatron/, models/) import
both. verl's extra methods are added to the core classes by the modules every import passes through (this one for
``DataProto`` and ``Worker``, ray/__init__.py for the Ray classes; single_controller/extension.py), and the extra
dispatch modes register themselves (compat/dispatch.py), so no import order sees a class or a mode without them.
"""

from importlib import import_module

from single_controller.base.register import Dispatch, Execute, register
from single_controller.base.worker import Worker
from single_controller.compat import dispatch as _verl_dispatch_modes  # noqa: F401  (registers the modes on import)
from single_controller.compat.data_proto import VerlDataProtoMethods
from single_controller.compat.worker import VerlWorkerMethods
from single_controller.extension import add_methods
from single_controller.protocol import DataProto, DataProtoConfig, DataProtoFuture

add_methods(DataProto, VerlDataProtoMethods)
add_methods(Worker, VerlWorkerMethods)

# Loaded on first use: `from single_controller import DataProto` must not import Ray.
_LAZY = {
    "RayResourcePool": "single_controller.ray.placement",
    "RayClassWithInitArgs": "single_controller.ray.placement",
    "RayWorkerGroup": "single_controller.ray.group",
    "create_colocated_worker_cls": "single_controller.ray.colocate",
    "WorkerDiedError": "single_controller.ray.health",
    "shutdown_worker_group": "single_controller.ray.health",
}

__all__ = ["DataProto", "DataProtoConfig", "DataProtoFuture", "Dispatch", "Execute", "Worker", "register", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'single_controller' has no attribute {name!r}")
