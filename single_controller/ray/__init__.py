from single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourceUnavailableError,
    create_colocated_worker_cls,
    merge_resource_pool,
)

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourceUnavailableError",
    "create_colocated_worker_cls",
    "merge_resource_pool",
]
