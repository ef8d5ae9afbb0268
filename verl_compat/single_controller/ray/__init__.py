"""verl's ``verl.single_controller.ray``: worker groups, pools, worker classes and colocation (base.py)."""

from verl_compat.single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourceUnavailableError,
    SubRayResourcePool,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    create_colocated_worker_raw_cls,
    merge_resource_pool,
    split_resource_pool,
)

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
