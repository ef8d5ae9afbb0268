"""verl's ``single_controller.ray`` import path: worker groups, pools, worker classes and colocation.

Every ``single_controller.ray.*`` import runs this module first, so it is where verl's extra methods of the
Ray classes are added (compat/worker_group.py to ``RayWorkerGroup``, compat/placement.py to
``RayClassWithInitArgs``; single_controller/extension.py): no import order sees the classes without them.
verl's fused classes and cut pools (compat/fused.py, compat/resource_pool.py) are loaded on first use, through
ray/base.py: they import ray/ modules, so loading them here would be circular when one of them is imported first.
"""

from importlib import import_module

from single_controller.compat.placement import VerlClassOptions
from single_controller.compat.worker_group import VerlWorkerGroupMethods
from single_controller.extension import add_methods
from single_controller.ray.colocate import create_colocated_worker_cls
from single_controller.ray.group import RayWorkerGroup
from single_controller.ray.placement import RayClassWithInitArgs, RayResourcePool, ResourceUnavailableError

add_methods(RayWorkerGroup, VerlWorkerGroupMethods)
add_methods(RayClassWithInitArgs, VerlClassOptions)

_COMPAT = (
    "SubRayResourcePool",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "merge_resource_pool",
    "split_resource_pool",
)

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourceUnavailableError",
    "create_colocated_worker_cls",
    *_COMPAT,
]


def __getattr__(name: str):
    if name in _COMPAT:
        return getattr(import_module("single_controller.ray.base"), name)
    raise AttributeError(f"module 'single_controller.ray' has no attribute {name!r}")
