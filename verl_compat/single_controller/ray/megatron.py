"""The seeds' ``verl.single_controller.ray.megatron`` (the trainer never uses it): a worker group of tensor-parallel
workers: data-parallel inputs in, the model's parallelism hidden.

Driver code sees only ``dp_size``: a ``Dispatch.MEGATRON_COMPUTE`` method takes lists of length
dp_size, every rank of a dp group (all its tp and pp ranks) gets that group's item, and only tp
rank 0 of the last pipeline stage of each dp group reports back.
"""

from __future__ import annotations

from single_controller.ray.placement import RayResourcePool
from verl_compat.single_controller.base.megatron.worker import DistGlobalInfo, DistRankInfo, TensorParallelWorker
from verl_compat.single_controller.ray.base import RayClassWithInitArgs, RayWorkerGroup

__all__ = ["TensorParallelRayWorkerGroup", "NVMegatronRayWorkerGroup"]


class TensorParallelRayWorkerGroup(RayWorkerGroup):
    """A ``RayWorkerGroup`` of ``TensorParallelWorker``s that knows each rank's (tp, dp, pp) place."""

    def __init__(self, resource_pool: RayResourcePool, ray_cls_with_init: RayClassWithInitArgs, **kwargs) -> None:
        if not issubclass(ray_cls_with_init.user_cls, TensorParallelWorker):
            raise TypeError(
                f"{type(self).__name__} needs a TensorParallelWorker (MegatronWorker) subclass, "
                f"got {ray_cls_with_init.user_cls.__name__}"
            )
        super().__init__(resource_pool, ray_cls_with_init, **kwargs)
        # Read by the MEGATRON dispatch and collect functions (base/decorator.py).
        self._megatron_rank_info: list[DistRankInfo] = self.execute_all_sync("get_megatron_rank_info")
        self._megatron_global_info: DistGlobalInfo = self.execute_rank_zero_sync("get_megatron_global_info")

    @property
    def tp_size(self) -> int:
        return self._megatron_global_info.tp_size

    @property
    def dp_size(self) -> int:
        return self._megatron_global_info.dp_size

    @property
    def pp_size(self) -> int:
        return self._megatron_global_info.pp_size

    def get_megatron_rank_info(self, rank: int) -> DistRankInfo:
        """Where global rank ``rank`` sits in the (pp, dp, tp) mesh."""
        return self._megatron_rank_info[rank]


NVMegatronRayWorkerGroup = TensorParallelRayWorkerGroup  # the seed's name
