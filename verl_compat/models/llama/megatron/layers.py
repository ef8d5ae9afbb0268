"""The seeds' ``verl.models.llama.megatron.layers`` (the trainer never uses it): LLaMA's MLP, whole and tensor-parallel
(Megatron-style: gate/up column-parallel, down row-parallel).

    y = down(silu(gate(x)) * up(x))            x, y: (..., hidden); gate(x), up(x): (..., ffn)

Sharded over a tp mesh of size t, each rank holds ffn/t rows of gate and up and ffn/t columns of
down. gate and up then give each rank its ffn/t slice of the activations, silu(.) * up is
element-wise so it needs no communication, and down's partial sums are all-reduced: one
all-reduce per forward, as in Megatron-LM's ParallelMLP. ``parallelize_module`` does the sharding
with PyTorch's DTensor, so it runs on gloo (CPU) and nccl (GPU) alike.

``ParallelLlamaMLP(config, megatron_config)`` is the seeds' class: the layer sharded over the tp mesh of the process's
worker (``TensorParallelWorker.init_model_parallel``), ``megatron_config`` from verl_compat.utils.megatron_utils.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from verl_compat.single_controller.base.megatron.worker import model_parallel_mesh


class LlamaMLP(nn.Module):
    """The unsharded LLaMA MLP (no biases, SiLU gate)."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "silu") -> None:
        super().__init__()
        if hidden_act != "silu":
            raise ValueError(f"LlamaMLP supports hidden_act='silu' only, got {hidden_act!r}")
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., hidden) -> (..., hidden)."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def llama_mlp_tp_plan() -> dict[str, ParallelStyle]:
    """gate/up split by output features (Shard(0) of the weight), down by input features (Shard(1))."""
    return {"gate_proj": ColwiseParallel(), "up_proj": ColwiseParallel(), "down_proj": RowwiseParallel()}


def weight_shard_dims() -> dict[str, int]:
    """Parameter name -> the weight dimension that tensor parallelism splits."""
    return {
        f"{name}.weight": 0 if isinstance(style, ColwiseParallel) else 1 for name, style in llama_mlp_tp_plan().items()
    }


def parallel_llama_mlp(config: Mapping, tp_mesh: DeviceMesh, device: torch.device | str = "cpu") -> LlamaMLP:
    """A ``LlamaMLP`` sharded over ``tp_mesh`` (config: hidden_size, intermediate_size[, hidden_act, tp]).

    Every rank builds the whole layer, then keeps its shard; the shards are cut from tp rank 0's
    weights, so the sharded layer equals rank 0's unsharded one.
    """
    _check_sizes(config, tp_mesh.size())
    with torch.device(device):
        mlp = LlamaMLP(config["hidden_size"], config["intermediate_size"], config.get("hidden_act", "silu"))
    return _sharded(mlp, tp_mesh)


class ParallelLlamaMLP(LlamaMLP):
    """The seeds' ``ParallelLlamaMLP(config=..., megatron_config=...)``: ``parallel_llama_mlp`` over the tp mesh of
    this process's worker, on its device; ``megatron_config.tensor_model_parallel_size`` must be the mesh's."""

    def __init__(self, config: Mapping, megatron_config: Any) -> None:
        tp_mesh = model_parallel_mesh()["tp"]
        if megatron_config.tensor_model_parallel_size != tp_mesh.size():
            raise ValueError(
                f"megatron_config.tensor_model_parallel_size={megatron_config.tensor_model_parallel_size} does not "
                f"match the worker's tp mesh of size {tp_mesh.size()}"
            )
        _check_sizes(config, tp_mesh.size())
        with torch.device(tp_mesh.device_type):  # the worker's device (on cuda: the one Worker set as current)
            super().__init__(config["hidden_size"], config["intermediate_size"], config.get("hidden_act", "silu"))
        self.to(megatron_config.params_dtype)
        _sharded(self, tp_mesh)


def _check_sizes(config: Mapping, tp_size: int) -> None:
    if config.get("tp", tp_size) != tp_size:
        raise ValueError(f"config tp={config['tp']} does not match the tp mesh size {tp_size}")
    if config["intermediate_size"] % tp_size:
        raise ValueError(f"intermediate_size={config['intermediate_size']} must be divisible by tp={tp_size}")


def _sharded(mlp: LlamaMLP, tp_mesh: DeviceMesh) -> LlamaMLP:
    parallelize_module(mlp, tp_mesh, llama_mlp_tp_plan())
    mlp.register_forward_hook(_wait_for_all_reduce)
    return mlp


def _wait_for_all_reduce(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    """Finish down_proj's asynchronous all-reduce before the output can leave the layer.

    RowwiseParallel returns an AsyncCollectiveTensor that waits only when a torch op touches it;
    pickled as is (e.g. returned through Ray) it would carry this rank's partial sum.
    """
    return output.wait() if isinstance(output, AsyncCollectiveTensor) else output


def local_shards(module: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's part of every parameter, on the CPU (whole tensors for unsharded parameters)."""
    return {
        name: (p.to_local() if isinstance(p, DTensor) else p).detach().cpu() for name, p in module.named_parameters()
    }


def merge_tp_shards(shards: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The unsharded state dict from the per-rank shards of one tp group, given in tp-rank order."""
    dims = weight_shard_dims()
    return {name: torch.cat([shard[name] for shard in shards], dim=dims[name]) for name in shards[0]}
