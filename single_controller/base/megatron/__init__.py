"""Seed-only (not used by the trainer): workers in a (pp, dp, tp) mesh, tensor-parallel models behind a worker group."""

from single_controller.base.megatron.worker import (
    DistGlobalInfo,
    DistRankInfo,
    MegatronWorker,
    TensorParallelWorker,
    model_parallel_shape,
)

__all__ = ["DistGlobalInfo", "DistRankInfo", "MegatronWorker", "TensorParallelWorker", "model_parallel_shape"]
