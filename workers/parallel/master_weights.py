"""Mixed precision on one rank without FSDP: bf16 compute weights, fp32 master weights.

FSDP2's mixed precision keeps fp32 parameter shards, casts them to bf16 before each forward and reduces the
gradients into fp32. A single rank has nothing to shard, and there those per-forward casts, FSDP's hooks and
the DTensor optimizer step are pure overhead (docs/benchmarks.md, "One bf16 rank without FSDP").
``MasterWeights`` does the same arithmetic directly:

- the module computes with bf16 parameters (buffers such as RoPE's ``inv_freq`` stay fp32, as under FSDP);
- each bf16 gradient is added into its fp32 master's ``.grad`` as soon as backward has produced it (so
  micro-batches accumulate in fp32, and clipping and AdamW see fp32 gradients, as with ``reduce_dtype=fp32``);
- the optimizer steps the masters, then the masters are copied back into the bf16 parameters;
- a frozen parameter (LoRA's base weights) has no fp32 master: both modules hold its one bf16 copy, which nothing
  ever updates (fp32 masters of a frozen 135 M-parameter base would hold 540 MB for nothing).

The masters live in a module of their own (``master``: same names, the model's config), which is what
checkpoints save and load; checkpoints therefore stay fp32 (the trained parameters) and load into any world size.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
from torch import Tensor, nn

from workers.parallel.optim import build_optimizer


def cast_parameters(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast ``module``'s floating-point parameters (not its buffers) to ``dtype`` in place; returns it."""
    with torch.no_grad():
        for param in module.parameters():
            if param.is_floating_point():
                param.data = param.data.to(dtype)
    return module


def _accumulate_into(master: nn.Parameter, param: Tensor) -> None:
    """Post-accumulate-grad hook of a compute parameter: move its gradient into the master's, in fp32."""
    if master.grad is None:
        master.grad = param.grad.to(master.dtype)
    else:
        master.grad.add_(param.grad)
    param.grad = None


class MasterWeights:
    """A module computing in ``dtype`` (``self.module``) tied to fp32 master copies (``self.master``).

    ``master`` is the loaded fp32 model; the compute module is a copy with its parameters cast. Build the
    optimizer over ``master.parameters()`` and :meth:`bind` it, so every step refreshes the compute weights;
    ``master.load_state_dict`` (a checkpoint) refreshes them too.
    """

    def __init__(self, master: nn.Module, dtype: torch.dtype) -> None:
        self.master = master
        # copy the module with its parameters already cast (no transient second fp32 copy of the weights)
        cast = {id(m): nn.Parameter(m.detach().to(dtype), m.requires_grad) for m in master.parameters()}
        self.module = copy.deepcopy(master, memo=cast)
        with torch.no_grad():  # frozen parameters: one copy, in the compute dtype
            for param in master.parameters():
                if not param.requires_grad:
                    param.data = cast[id(param)].data
        # deepcopy keeps the parameter order (and tied parameters tied), so the two lists pair up
        self._pairs = [(p, m) for p, m in zip(self.module.parameters(), master.parameters()) if m.requires_grad]
        for param, master_param in self._pairs:
            param.register_post_accumulate_grad_hook(functools.partial(_accumulate_into, master_param))
        # a checkpoint loads into the masters; the compute copy follows on its own
        master.register_load_state_dict_post_hook(lambda *_: self.copy_to_module())

    def bind(self, optimizer: torch.optim.Optimizer) -> None:
        """Copy the masters into the compute weights after each ``optimizer.step()``."""
        optimizer.register_step_post_hook(lambda *_: self.copy_to_module())

    @torch.no_grad()
    def copy_to_module(self) -> None:
        """Refresh the compute weights from the masters (hooked to each optimizer step and state-dict load)."""
        for param, master_param in self._pairs:
            param.copy_(master_param)


def on_one_rank(model: nn.Module, dtype: torch.dtype | None, trained: bool) -> tuple[nn.Module, MasterWeights | None]:
    """(module to compute with, its ``MasterWeights`` or None) for ``model`` on a single rank computing in ``dtype``.

    fp32 (or None) leaves the model as it is; in a lower precision a trained model computes on a cast copy of
    fp32 masters, and a frozen one is cast in place.
    """
    if dtype is None or dtype == torch.float32:
        return model, None
    if not trained:
        return cast_parameters(model, dtype), None
    weights = MasterWeights(model, dtype)
    return weights.module, weights


def optimizer_for(module: nn.Module, weights: MasterWeights | None, optim_config: Any) -> torch.optim.Optimizer:
    """AdamW over ``module``'s parameters, or over its fp32 masters (then each step refreshes the module)."""
    optimizer = build_optimizer(weights.master if weights is not None else module, optim_config)
    if weights is not None:
        weights.bind(optimizer)
    return optimizer


def checkpointed(module: nn.Module, weights: MasterWeights | None) -> nn.Module:
    """The module whose weights a checkpoint holds: the fp32 masters where there are any."""
    return weights.master if weights is not None else module
