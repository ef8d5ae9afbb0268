"""verl's ``single_controller.ray`` import path: worker groups, pools, worker classes and colocation.

verl's classes (compat/'s subclasses of the core's: ``RayWorkerGroup``, ``RayClassWithInitArgs``, the colocated
``WorkerDict`` of ``create_colocated_worker_cls``), verl's fused classes and cut pools, all loaded on first use
through ray/base.py: every ``single_controller.ray.*`` import runs this module first, and a core module
(ray/group.py) must import no compat module.
"""

from importlib import import_module

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourceUnavailableError",
    "SubRayResourcePool",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "merge_resource_pool",
    "split_resource_pool",
]


def __getattr__(name: str):
    if name in __all__:
        return getattr(import_module("single_controller.ray.base"), name)
    raise AttributeError(f"module 'single_controller.ray' has no attribute {name!r}")
