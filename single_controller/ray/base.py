"""verl's import path for worker groups, pools, worker classes and colocation (``verl.single_controller.ray.base``).

It only re-exports: ``RayWorkerGroup`` is in ray/group.py, the pools and ``RayClassWithInitArgs`` in
ray/placement.py, ``create_colocated_worker_cls`` in ray/colocate.py; verl's fused classes and pools cut from
other pools in compat/fused.py and compat/resource_pool.py.
"""

from single_controller.compat.fused import create_colocated_worker_cls_fused, create_colocated_worker_raw_cls
from single_controller.compat.resource_pool import SubRayResourcePool, merge_resource_pool, split_resource_pool
from single_controller.ray.colocate import create_colocated_worker_cls
from single_controller.ray.group import RayWorkerGroup
from single_controller.ray.placement import RayClassWithInitArgs, RayResourcePool, ResourceUnavailableError

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
