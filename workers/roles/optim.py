"""Optimizer and learning-rate schedule for the actor and the critic: AdamW with a linear warm-up."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def build_optimizer(module: nn.Module, optim_config: Any) -> torch.optim.AdamW:
    """AdamW over the trainable parameters with ``lr``, ``betas`` and ``weight_decay`` from ``optim_config``.

    Fused (one kernel per parameter, HF Trainer's default ``adamw_torch_fused``) on CPU and CUDA: the default
    per-tensor loop launches a dozen ops per parameter, which on a small model costs more than the arithmetic
    (docs/benchmarks.md, "What each default saves"). Same update, and the same state dict, so checkpoints load
    either way. FSDP2's DTensor parameters take the fused kernel too.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        params,
        lr=float(optim_config.lr),
        betas=tuple(float(b) for b in optim_config.betas),
        weight_decay=float(optim_config.weight_decay),
        fused=all(p.device.type in FUSED_ADAMW_DEVICES for p in params) or None,
    )


def warmup_steps(optim_config: Any, total_training_steps: int) -> int:
    """``lr_warmup_steps`` when > 0, else ``lr_warmup_steps_ratio`` × total steps (0: no warm-up)."""
    steps = int(optim_config.lr_warmup_steps)
    if steps > 0:
        return steps
    return int(float(optim_config.lr_warmup_steps_ratio) * max(total_training_steps, 0))


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_config: Any, total_training_steps: int) -> LambdaLR:
    """Linear warm-up then constant: lr_k = lr · min(1, (k+1)/W) for the k-th scheduler step (k from 0).

    The first update already uses lr/W rather than 0, and the W-th uses the full lr.
    """
    num_warmup = warmup_steps(optim_config, total_training_steps)

    def factor(step: int) -> float:
        return 1.0 if num_warmup <= 0 else min(1.0, (step + 1) / num_warmup)

    return LambdaLR(optimizer, factor)
