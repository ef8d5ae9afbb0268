"""verl's import path for worker groups, pools, worker classes and colocation (``verl.single_controller.ray.base``).

It only re-exports verl's classes: ``RayWorkerGroup`` (compat/worker_group.py, the core's in ray/group.py),
``RayClassWithInitArgs`` (compat/placement.py, the core's in ray/placement.py with the pools),
``create_colocated_worker_cls`` and the fused classes (compat/fused.py, the core's in ray/colocate.py), and pools
cut from other pools (compat/resource_pool.py).
"""

from single_controller.compat.fused import (
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    create_colocated_worker_raw_cls,
)
from single_controller.compat.placement import RayClassWithInitArgs
from single_controller.compat.resource_pool import SubRayResourcePool, merge_resource_pool, split_resource_pool
from single_controller.compat.worker_group import RayWorkerGroup
from single_controller.ray.placement import RayResourcePool, ResourceUnavailableError

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
