"""Masked statistics over (bs, response_length) tensors, and per-token log-probs and entropies from logits.

``mask`` is 1 on real response tokens and 0 on padding; an all-masked slice gives 0 instead of NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from algos.host_sync import host_read


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ values·mask over ``dim`` (all elements when None); a NaN or inf outside the mask does not leak in."""
    return (torch.where(mask.bool(), values, 0.0) * mask).sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ values·mask / Σ mask over ``dim``; an all-masked slice gives 0 instead of NaN."""
    return masked_sum(values, mask, dim) / mask.sum(dim=dim).clamp_min(1e-8)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked elements (scalar), Bessel-corrected when ``unbiased``."""
    centered = values - masked_mean(values, mask)
    var = masked_mean(centered**2, mask)
    if unbiased:
        n = mask.sum()
        count = host_read("stats.masked_var_count", n, meta_value=2)
        if count < 2:
            raise ValueError(f"masked_var(unbiased=True) needs at least 2 unmasked elements, got {count}")
        var = var * n / (n - 1)
    return var


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """(values − mean) / sqrt(var + 1e-8) with masked statistics; keeps the mean when not ``shift_mean``."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy (...) of softmax(logits (..., V)): H = logsumexp(z) − Σ softmax(z)·z (no log of tiny probs)."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(logits)[labels]: (..., V), (...) -> (...); gathers first, so no (..., V) log-softmax is kept."""
    picked = logits.gather(dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def sum_pi_squared_from_logits(logits: Tensor) -> Tensor:
    """Σ_v π(v)² (...) of π = softmax(logits (..., V)) = exp(logsumexp(2z) − 2·logsumexp(z)); 1 for one token."""
    return torch.exp(torch.logsumexp(2.0 * logits, dim=-1) - 2.0 * torch.logsumexp(logits, dim=-1))
