"""verl's ``verl.single_controller``: its classes in one place, each loaded on first use (so that importing a
submodule, ``verl_compat.single_controller.base.decorator``, loads no more than it needs).

``DataProto`` (protocol.py), ``Worker`` (base/worker.py), ``Dispatch`` / ``Execute`` / ``register``
(base/decorator.py), ``RayResourcePool``, ``RayClassWithInitArgs``, ``RayWorkerGroup``,
``create_colocated_worker_cls`` (ray/base.py), and the core's ``DataProtoConfig``, ``DataProtoFuture``,
``WorkerDiedError`` and ``shutdown_worker_group``.
"""

from importlib import import_module

_LAZY = {
    "DataProto": "verl_compat.protocol",
    "DataProtoConfig": "verl_compat.protocol",
    "DataProtoFuture": "verl_compat.protocol",
    "Dispatch": "verl_compat.single_controller.base.decorator",
    "Execute": "verl_compat.single_controller.base.decorator",
    "register": "verl_compat.single_controller.base.decorator",
    "Worker": "verl_compat.single_controller.base.worker",
    "RayResourcePool": "verl_compat.single_controller.ray.base",
    "RayClassWithInitArgs": "verl_compat.single_controller.ray.base",
    "RayWorkerGroup": "verl_compat.single_controller.ray.base",
    "create_colocated_worker_cls": "verl_compat.single_controller.ray.base",
    "WorkerDiedError": "single_controller.ray.health",
    "shutdown_worker_group": "single_controller.ray.health",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'verl_compat.single_controller' has no attribute {name!r}")
