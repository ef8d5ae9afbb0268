"""Which scaled-dot-product-attention kernel a forward uses where torch's own choice is slow: bf16 on a CPU.

On a CPU torch picks its flash-attention kernel whenever it can. In fp32 that is right, and in bf16 for long
sequences or large heads too, but for short sequences with small heads its bf16 backward is several times
slower than the plain math path (docs/benchmarks.md, "Attention kernel"). Forwards alone run about as fast
either way, so only the updates, whose backward runs the kernel their forward chose, switch to the math path.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

MATH_MAX_SEQ_LEN = 128  # above it, or with larger heads, flash wins again (docs/benchmarks.md)
MATH_MAX_HEAD_DIM = 64


def head_dim(module: nn.Module) -> int | None:
    """The attention head size of an HF model (None if its config does not say)."""
    config = getattr(module, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    if not heads:
        return None
    return getattr(config, "head_dim", None) or config.hidden_size // heads


def sdpa_backend(module: nn.Module, device: torch.device, dtype: torch.dtype, seq_len: int) -> AbstractContextManager:
    """For a training forward + backward: the math SDPA backend in bf16 on a CPU for sequences of at most
    ``MATH_MAX_SEQ_LEN`` tokens and heads of at most ``MATH_MAX_HEAD_DIM``; torch's own choice otherwise."""
    size = head_dim(module)
    if (
        device.type == "cpu"
        and dtype == torch.bfloat16
        and seq_len <= MATH_MAX_SEQ_LEN
        and size is not None
        and size <= MATH_MAX_HEAD_DIM
    ):
        return sdpa_kernel([SDPBackend.MATH])
    return nullcontext()
