"""The seeds' ``verl.utils.megatron_utils``: ``init_model_parallel_config``, the model-parallel settings a layer of
verl_compat.models.llama.megatron.layers is built with (the part of Megatron-LM's ``ModelParallelConfig`` they read)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

__all__ = ["ModelParallelConfig", "init_model_parallel_config"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class ModelParallelConfig:
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    params_dtype: torch.dtype = torch.float32


def init_model_parallel_config(config: Mapping) -> ModelParallelConfig:
    """The settings from the seeds' keys: ``tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
    ``param_dtype`` (fp32, bf16 or fp16) and ``sequence_parallel`` (False: ColoRL's layers do not split the
    sequence); the ranks and virtual-pipeline keys the seeds also pass are the mesh's business and not read."""
    if config.get("sequence_parallel", False):
        raise ValueError("sequence_parallel=True: the tensor-parallel layers here split the hidden dims only")
    dtype = config.get("param_dtype", "fp32")
    if dtype not in DTYPES:
        raise ValueError(f"param_dtype={dtype!r}; valid: {list(DTYPES)}")
    return ModelParallelConfig(
        int(config.get("tensor_model_parallel_size", 1)),
        int(config.get("pipeline_model_parallel_size", 1)),
        DTYPES[dtype],
    )
