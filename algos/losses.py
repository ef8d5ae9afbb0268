"""Losses: the dual-clip PPO policy surrogate (token or sequence ratio), the clipped value loss, and how a
(bs, response_length) loss matrix is aggregated to a scalar.

Losses return ``(loss, metrics)``; metrics map namespaced names (``actor/pg_loss``, ``critic/vf_loss``) to
detached scalar tensors, so no host sync happens here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from algos.stats import masked_mean, masked_sum

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
POLICY_LOSS_MODES = ("vanilla", "gspo")


def agg_loss(loss_mat: Tensor, loss_mask: Tensor, loss_agg_mode: str) -> Tensor:
    """Reduce a (bs, response_length) loss matrix to a scalar.

    token-mean: Σ L·m / Σ m;  seq-mean-token-sum: mean_i Σ_t L·m;  seq-mean-token-mean: mean_i (Σ_t L·m / Σ_t m);
    seq-mean-token-sum-norm: Σ L·m / response_length (Dr.GRPO: a constant normaliser, no length bias).
    """
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-sum":
        return masked_sum(loss_mat, loss_mask, dim=-1).mean()
    if loss_agg_mode == "seq-mean-token-mean":
        return masked_mean(loss_mat, loss_mask, dim=-1).mean()
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return masked_sum(loss_mat, loss_mask) / loss_mask.shape[-1]
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid: {list(LOSS_AGG_MODES)}")


def _log_ratio(old_log_prob: Tensor, log_prob: Tensor, response_mask: Tensor, loss_mode: str) -> Tensor:
    """log π/π_old per token (vanilla) or the GSPO-token form sg[log s_i] + log π_t − sg[log π_t]."""
    if loss_mode == "vanilla":
        return (log_prob - old_log_prob).clamp(-20.0, 20.0)
    if loss_mode == "gspo":
        # s_i = exp(mean_t log π/π_old): a length-normalised sequence ratio whose per-token gradient is s_i·∇log π_t.
        seq_log_ratio = masked_mean(log_prob - old_log_prob, response_mask, dim=-1).detach().clamp(-20.0, 20.0)
        return seq_log_ratio.unsqueeze(-1) + log_prob - log_prob.detach()
    raise ValueError(f"unknown policy loss_mode {loss_mode!r}; valid: {list(POLICY_LOSS_MODES)}")


def compute_policy_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    loss_mode: str = "vanilla",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Dual-clip PPO surrogate (Ye et al. 2020) on a per-token (vanilla) or sequence-level (gspo) ratio.

    ρ = exp(log π − log π_old)  (gspo: exp of the sequence's mean log-ratio, with each token's gradient),
    L1 = −A·ρ,  L2 = −A·clip(ρ, 1−ε_low, 1+ε_high),  L = max(L1, L2);  for A < 0: L = min(L, −A·c).

    Args:
        old_log_prob: (bs, response_length) log-probs of the sampled tokens under the policy that sampled them.
        log_prob: (bs, response_length) the same under the current policy (carries the gradient).
        advantages: (bs, response_length), zero outside the mask.
        response_mask: (bs, response_length) 1 on response tokens, 0 on padding.
        clip_ratio_low, clip_ratio_high: ε_low, ε_high of the clip range [1−ε_low, 1+ε_high].
        clip_ratio_c: c > 1, the dual-clip bound on the loss of a negative-advantage token.
        loss_agg_mode: how the (bs, response_length) loss matrix becomes a scalar (``agg_loss``).
        loss_mode: ``vanilla`` (token ratio) or ``gspo`` (sequence ratio).

    Returns:
        (scalar loss, metrics): actor/pg_loss, actor/pg_clipfrac, actor/ppo_kl, actor/pg_clipfrac_lower.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    ratio = torch.exp(_log_ratio(old_log_prob, log_prob, response_mask, loss_mode))
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped = torch.maximum(loss1, loss2)
    loss3 = -advantages * clip_ratio_c  # caps how far a very large ratio can push down a negative-advantage token
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(clipped, loss3), clipped)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": pg_loss.detach(),
            "actor/pg_clipfrac": masked_mean((loss2 > loss1).float(), response_mask),
            "actor/ppo_kl": masked_mean(old_log_prob - log_prob, response_mask),
            "actor/pg_clipfrac_lower": masked_mean(((clipped > loss3) & negative).float(), response_mask),
        }
    return pg_loss, metrics


def compute_value_loss(
    vpreds: Tensor,
    returns: Tensor,
    values: Tensor,
    response_mask: Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss: 0.5·agg(max((V̂ − R)², (clip(V̂, V − c, V + c) − R)²)).

    Args:
        vpreds: (bs, response_length) V̂, the values being trained.
        returns: (bs, response_length) R, the targets from the advantage estimator.
        values: (bs, response_length) V, the values at rollout time (the clip's centre).
        response_mask: (bs, response_length) 1 on response tokens.
        cliprange_value: c, how far V̂ may move from V before its loss stops shrinking.
        loss_agg_mode: see ``agg_loss``.

    Returns:
        (scalar loss, metrics): critic/vf_loss, critic/vf_clipfrac, critic/vpred_mean.
    """
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    loss1 = (vpreds - returns) ** 2
    loss2 = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(loss1, loss2), response_mask, loss_agg_mode)
    with torch.no_grad():
        metrics = {
            "critic/vf_loss": vf_loss.detach(),
            "critic/vf_clipfrac": masked_mean((loss2 > loss1).float(), response_mask),
            "critic/vpred_mean": masked_mean(vpreds, response_mask),
        }
    return vf_loss, metrics

