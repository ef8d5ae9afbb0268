"""The seed's import path (``single_controller.ray.megatron``).

The code is in single_controller/compat/megatron_group.py.
"""

from single_controller.compat.megatron_group import NVMegatronRayWorkerGroup, TensorParallelRayWorkerGroup

__all__ = ["NVMegatronRayWorkerGroup", "TensorParallelRayWorkerGroup"]
