"""Optimizer and learning-rate schedule for the actor and the critic (the ``optim`` section).

``optimizer`` from ``optimizer_impl``: torch.optim's AdamW is ColoRL's fused AdamW; any other class
is imported and built with (``lr``, ``weight_decay``, ``betas`` for Adam-like ones, then
``override_optimizer_config``). The schedule: linear warm-up, then constant or cosine (``lr_scheduler_type``).
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def build_optimizer(module: nn.Module, optim_config: Any) -> torch.optim.Optimizer:
    """The optimizer over the trainable parameters of ``module``.

    torch.optim's AdamW is fused (one kernel per parameter, HF Trainer's default ``adamw_torch_fused``) on CPU and
    CUDA: the default per-tensor loop launches a dozen ops per parameter, which on a small model costs more than the
    arithmetic (docs/benchmarks.md, "What each default saves"). Same update, and the same state dict, so
    checkpoints load either way. FSDP2's DTensor parameters take the fused kernel too.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    name = getattr(optim_config, "optimizer", "AdamW")
    impl = getattr(optim_config, "optimizer_impl", "torch.optim")
    kwargs: dict[str, Any] = {"lr": float(optim_config.lr), "weight_decay": float(optim_config.weight_decay)}
    if "adam" in name.lower():
        kwargs["betas"] = tuple(float(b) for b in optim_config.betas)
    kwargs.update(getattr(optim_config, "override_optimizer_config", None) or {})
    if (impl, name) == ("torch.optim", "AdamW"):
        kwargs.setdefault("fused", all(p.device.type in FUSED_ADAMW_DEVICES for p in params) or None)
    return getattr(importlib.import_module(impl), name)(params, **kwargs)


def warmup_steps(optim_config: Any, total_training_steps: int) -> int:
    """``lr_warmup_steps`` when > 0, else ``lr_warmup_steps_ratio`` × total steps (0: no warm-up)."""
    steps = int(optim_config.lr_warmup_steps)
    if steps > 0:
        return steps
    return int(float(optim_config.lr_warmup_steps_ratio) * max(total_training_steps, 0))


def lr_factor(step: int, optim_config: Any, total_training_steps: int) -> float:
    """The learning rate of the k-th scheduler step (k from 0) as a share of ``lr``.

    With s = k (``zero_indexed_step``, the default) or k + 1, and W warm-up steps of T: s/W while s < W; then 1
    (constant), or cosine: max(m, (1+m)/2 + (1-m)/2 · cos(2π · c · (s-W)/(T-W))) with m = ``min_lr_ratio``,
    c = ``num_cycles`` (0.5: one half-wave from lr down to m·lr).
    """
    num_warmup = warmup_steps(optim_config, total_training_steps)
    s = step if getattr(optim_config, "zero_indexed_step", True) else step + 1
    if s < num_warmup:
        return s / max(1, num_warmup)
    if getattr(optim_config, "lr_scheduler_type", "constant") != "cosine":
        return 1.0
    floor = float(optim_config.min_lr_ratio or 0.0)
    progress = (s - num_warmup) / max(1, total_training_steps - num_warmup)
    wave = math.cos(math.pi * float(optim_config.num_cycles) * 2.0 * progress)
    return max(floor, (1 + floor) / 2 + (1 - floor) / 2 * wave)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_config: Any, total_training_steps: int) -> LambdaLR:
    """``lr_factor`` as a scheduler, stepped once per optimizer step."""
    return LambdaLR(optimizer, lambda step: lr_factor(step, optim_config, total_training_steps))
