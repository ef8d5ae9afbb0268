"""The seed's import path (``single_controller.models.llama_tp_mlp``).

The code is in single_controller/compat/llama_tp_mlp.py.
"""

from single_controller.compat.llama_tp_mlp import (
    LlamaMLP,
    llama_mlp_tp_plan,
    local_shards,
    merge_tp_shards,
    parallel_llama_mlp,
    weight_shard_dims,
)

__all__ = [
    "LlamaMLP",
    "llama_mlp_tp_plan",
    "local_shards",
    "merge_tp_shards",
    "parallel_llama_mlp",
    "weight_shard_dims",
]
