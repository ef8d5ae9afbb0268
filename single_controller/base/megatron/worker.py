"""The seed's import path (``single_controller.base.megatron.worker``).

The code is in single_controller/compat/megatron_worker.py.
"""

from single_controller.compat.megatron_worker import (
    DistGlobalInfo,
    DistRankInfo,
    MegatronWorker,
    TensorParallelWorker,
    model_parallel_shape,
)

__all__ = ["DistGlobalInfo", "DistRankInfo", "MegatronWorker", "TensorParallelWorker", "model_parallel_shape"]
