"""The seed's import path for the tensor-parallel (Megatron-style) worker; the code is in single_controller/compat/megatron_worker.py."""

from single_controller.base.megatron.worker import (
    DistGlobalInfo,
    DistRankInfo,
    MegatronWorker,
    TensorParallelWorker,
    model_parallel_shape,
)

__all__ = ["DistGlobalInfo", "DistRankInfo", "MegatronWorker", "TensorParallelWorker", "model_parallel_shape"]
