"""The policy losses, one pure function each (``algos.losses.POLICY_LOSSES`` names them).

Each takes the sampled tokens' log-probs under the old policy (``old_log_prob``) and the current one
(``log_prob``, which carries the gradient), the ``advantages`` and the ``response_mask``, all
(bs, response_length), plus its options as keywords with their defaults. It returns the per-token loss
matrix before aggregation and its metrics (detached scalars named ``actor/…``); ``algos.losses`` aggregates.
ρ = π/π_old is the importance ratio, A the advantage, ε_l/ε_h = ``clip_ratio_low``/``clip_ratio_high``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from algos.host_sync import host_read
from algos.stats import masked_mean


class PolicyLossTerms(NamedTuple):
    losses: Tensor  # (bs, response_length) per-token loss, before aggregation
    metrics: dict[str, Tensor]
    mask: Tensor | None = None  # the tokens the loss covers when it drops some; None: the response mask


def _metrics(mask: Tensor, **values: Tensor) -> dict[str, Tensor]:
    """``actor/<name>``: the masked mean of each (bs, response_length) tensor, detached."""
    return {f"actor/{name}": masked_mean(value.detach().float(), mask) for name, value in values.items()}


def _zero(like: Tensor) -> Tensor:
    """A metric every policy loss reports (so that the metric set is the same) and that is always 0 for this loss."""
    return torch.zeros((), device=like.device)


def compute_policy_loss_vanilla(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> PolicyLossTerms:
    """Dual-clip PPO (Schulman et al. 2017; Ye et al. 2020).

    ρ = exp(clamp(log π − log π_old, ±20)),  L = max(−A·ρ, −A·clip(ρ, 1−ε_l, 1+ε_h)),  for A < 0: L = min(L, −A·c).
    Metrics: pg_clipfrac (the clipped term won), ppo_kl = mean(log π_old − log π), pg_clipfrac_lower (the dual
    clip bound).
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped = torch.maximum(loss1, loss2)
    loss3 = -advantages * clip_ratio_c  # caps how far a very large ratio can push down a negative-advantage token
    negative = advantages < 0
    losses = torch.where(negative, torch.minimum(clipped, loss3), clipped)
    return PolicyLossTerms(
        losses,
        _metrics(
            response_mask, pg_clipfrac=loss2 > loss1, ppo_kl=-log_ratio, pg_clipfrac_lower=(clipped > loss3) & negative
        ),
    )


def compute_policy_loss_gspo(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
) -> PolicyLossTerms:
    """GSPO (Zheng et al. 2025): PPO's clip on the length-normalised sequence ratio, without a dual clip.

    log s_i = Σ_t (log π − log π_old)·m / |y_i|,  log s_i,t = min(sg[log s_i] + log π_t − sg[log π_t], 10), so the
    value is s_i and token t's gradient s_i·∇log π_t;  L = max(−A·s, −A·clip(s, 1−ε_l, 1+ε_h)).
    """
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = (log_ratio * response_mask).sum(-1) / response_mask.sum(-1).clamp(min=1)
    seq_ratio = torch.exp((seq_log_ratio.detach().unsqueeze(-1) + log_prob - log_prob.detach()).clamp(max=10.0))
    loss1 = -advantages * seq_ratio
    loss2 = -advantages * seq_ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    metrics = _metrics(response_mask, pg_clipfrac=loss2 > loss1, ppo_kl=-log_ratio)
    return PolicyLossTerms(torch.maximum(loss1, loss2), {**metrics, "actor/pg_clipfrac_lower": _zero(log_prob)})


def compute_policy_loss_sapo(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> PolicyLossTerms:
    """SAPO (Gao et al. 2025): a soft, temperature-controlled gate instead of a hard clip.

    f(ρ) = σ(τ·(ρ − 1))·4/τ with τ = τ_pos where A > 0 else τ_neg;  L = −f(ρ)·A. Its gradient, A·σ'·4·∇ρ,
    equals PPO's at ρ = 1 and fades smoothly away from it. Always aggregated seq-mean-token-mean.
    """
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    tau = torch.where(
        advantages > 0,
        torch.as_tensor(tau_pos, dtype=advantages.dtype, device=advantages.device),
        torch.as_tensor(tau_neg, dtype=advantages.dtype, device=advantages.device),
    )
    gates = torch.sigmoid(tau * (torch.exp(log_ratio) - 1.0)) * (4.0 / tau)
    zero = _zero(log_prob)
    metrics = {"actor/pg_clipfrac": zero, **_metrics(response_mask, ppo_kl=-log_ratio), "actor/pg_clipfrac_lower": zero}
    return PolicyLossTerms(-gates * advantages, metrics)


def compute_policy_loss_cispo(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
) -> PolicyLossTerms:
    """CISPO (MiniMax-M1, 2025): clip the importance weight, not the update; every token keeps a gradient.

    L = −sg[clip(ρ, 1−ε_l, 1+ε_h)]·A·log π, ρ = exp(clamp(log π − log π_old, ±20)). pg_clipfrac: ρ was clipped.
    """
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    metrics = _metrics(response_mask, pg_clipfrac=ratio != clipped, ppo_kl=-log_ratio)
    return PolicyLossTerms(
        -clipped.detach() * advantages * log_prob, {**metrics, "actor/pg_clipfrac_lower": _zero(log_prob)}
    )


def compute_policy_loss_gpg(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
) -> PolicyLossTerms:
    """GPG (Chu et al. 2025): the plain policy gradient, L = −log π·A (no ratio, no clip, no metrics)."""
    return PolicyLossTerms(-log_prob * advantages, {})


def compute_policy_loss_geo_mean(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
) -> PolicyLossTerms:
    """GMPO (Zhao et al. 2025): the geometric mean of the token ratios, each clipped in log space.

    r_t = log π − log π_old,  r̃_t = sgn(A)·min(sgn(A)·r_t, sgn(A)·clip(r_t, −ε_l, ε_h)),
    L_i = −Ā_i·exp(Σ_t r̃_t·m / |y_i|) with Ā_i the sequence's mean advantage; every token of row i carries L_i,
    so the seq-mean-token-mean aggregation is the mean of L_i over sequences. pg_clipfrac (A > 0) and
    pg_clipfrac_lower (A < 0): r_t was clipped.
    """
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    clamped = log_ratio.clamp(-clip_ratio_low, clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    length = response_mask.sum(dim=-1) + 1e-8
    seq_ratio = torch.exp((pessimistic * response_mask).sum(dim=-1) / length)
    seq_advantage = (advantages * response_mask).sum(dim=-1) / length
    losses = (-seq_advantage * seq_ratio).unsqueeze(-1).expand_as(log_prob)
    clipped = log_ratio != clamped
    return PolicyLossTerms(
        losses,
        _metrics(
            response_mask,
            pg_clipfrac=clipped & (advantages > 0),
            ppo_kl=-log_ratio,
            pg_clipfrac_lower=clipped & (advantages < 0),
        ),
    )


def _dppo(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    valid: Tensor,
    clip_ratio_c: float,
) -> PolicyLossTerms:
    """DPPO's loss once its trust-region mask ``valid`` is known: L = −A·sg[min(ρ, c)]·log π·valid."""
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    valid = valid.detach().float()
    losses = -advantages * ratio.clamp(max=clip_ratio_c).detach() * log_prob * valid
    return PolicyLossTerms(
        losses,
        _metrics(
            response_mask,
            pg_clipfrac=1.0 - valid,
            ppo_kl=-log_ratio,
            pg_clipfrac_lower=(ratio > clip_ratio_c).float() * valid,
        ),
    )


def compute_policy_loss_dppo_tv(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> PolicyLossTerms:
    """DPPO-Binary-TV (arXiv 2602.04879): a token learns while its probability moved less than ε in total variation.

    valid = (π − π_old ≤ ε_h) where A > 0, (π − π_old ≥ −ε_l) elsewhere;  L = −A·sg[min(ρ, c)]·log π·valid, with
    c = ``clip_ratio_c`` truncating the importance weight. pg_clipfrac: not valid; pg_clipfrac_lower: truncated.
    """
    moved = torch.exp(log_prob) - torch.exp(old_log_prob)
    valid = torch.where(advantages > 0, moved <= clip_ratio_high, moved >= -clip_ratio_low)
    return _dppo(old_log_prob, log_prob, advantages, response_mask, valid, clip_ratio_c)


def compute_policy_loss_dppo_kl(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> PolicyLossTerms:
    """DPPO-Binary-KL: as DPPO-Binary-TV with the KL between the binary distributions (p, 1 − p) of the token.

    D = p_old·(log p_old − log p) + (1 − p_old)·log((1 − p_old + 1e-8) / (1 − p + 1e-8));
    valid = (D ≤ ε_h or p ≤ p_old) where A > 0, (D ≤ ε_l or p ≥ p_old) elsewhere.
    """
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
    )
    valid = torch.where(
        advantages > 0,
        (binary_kl <= clip_ratio_high) | (prob <= old_prob),
        (binary_kl <= clip_ratio_low) | (prob >= old_prob),
    )
    return _dppo(old_log_prob, log_prob, advantages, response_mask, valid, clip_ratio_c)


def compute_policy_loss_dro(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    dro_beta: float | None = None,
) -> PolicyLossTerms:
    """Direct Reward Optimisation (Richemond et al. 2024): L = −(log π·A − ½β·(log π − log π_old)²), β > 0."""
    if dro_beta is None or dro_beta <= 0:
        raise ValueError(f"policy_loss.dro_beta must be > 0 for the dro loss, got {dro_beta}")
    log_ratio = log_prob - old_log_prob
    losses = -(log_prob * advantages - 0.5 * dro_beta * log_ratio.square())
    return PolicyLossTerms(losses, _metrics(response_mask, ppo_kl=-log_ratio))


def compute_policy_loss_clip_cov(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
) -> PolicyLossTerms:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL"): detach a few high-covariance tokens.

    L = max(−A·ρ, −A·clip(ρ, 1−ε_l, 1+ε_h)) with ρ = π/π_old, times 0 on max(⌊r·N⌋, 1) tokens (r =
    ``clip_cov_ratio``, N the valid tokens) drawn uniformly (torch's global RNG) among the valid tokens
    the clip left alone whose cov = (A − mean A)·(log π − mean log π) lies in (lb, ub). pg_clipfrac: dropped.
    """
    if clip_cov_ratio <= 0:
        raise ValueError(f"policy_loss.clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    valid = response_mask > 0
    with torch.no_grad():
        cov = (advantages - masked_mean(advantages, response_mask)) * (log_prob - masked_mean(log_prob, response_mask))
        candidate = (valid & ~(loss2 > loss1) & (cov > clip_cov_lb) & (cov < clip_cov_ub)).flatten()
        counts = torch.stack([response_mask.sum(), candidate.sum().to(response_mask.dtype)])
        n_valid, n_candidates = host_read("policy_losses.clip_cov_count", counts, meta_value=[advantages.numel()] * 2)
        n_clip = max(int(clip_cov_ratio * n_valid), 1)
        # the candidates' flat indices in row-major order (nonzero's, without its data-dependent shape)
        candidates = torch.argsort((~candidate).to(torch.uint8), stable=True)[: int(n_candidates)]
        keep = torch.ones_like(advantages)
        if n_candidates:  # torch's global RNG draws only then (the draws a seed gives stay the same)
            keep.view(-1)[candidates[torch.randperm(int(n_candidates))[:n_clip]]] = 0
    return PolicyLossTerms(
        torch.maximum(loss1, loss2) * keep, _metrics(response_mask, pg_clipfrac=keep == 0, ppo_kl=-log_ratio)
    )


def compute_policy_loss_kl_cov(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
) -> PolicyLossTerms:
    """KL-Cov (Cui et al. 2025): a |log ratio| penalty on the highest-covariance tokens, no clip.

    L = −A·ρ, plus β·|log π − log π_old| (β = ``ppo_kl_coef``) on the max(⌊r·N⌋, 1) valid tokens (r =
    ``kl_cov_ratio``) with the largest cov = (A − mean A)·(log π − mean log π). ppo_kl is mean |log ratio|.
    """
    if kl_cov_ratio <= 0:
        raise ValueError(f"policy_loss.kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    log_ratio = log_prob - old_log_prob
    losses = -advantages * torch.exp(log_ratio)
    valid = response_mask > 0
    n_valid = int(host_read("policy_losses.kl_cov_count", valid.sum(), meta_value=0))
    if n_valid:
        with torch.no_grad():  # on the CPU, so that ties pick the same tokens on every device
            adv, logp = advantages[valid].cpu(), log_prob[valid].cpu()
            cov = (adv - adv.mean()) * (logp - logp.mean())
            top = torch.topk(cov, max(1, int(n_valid * kl_cov_ratio))).indices
            penalised = torch.zeros(n_valid, dtype=torch.bool)
            penalised[top] = True
            chosen = torch.zeros_like(valid)
            chosen[valid] = penalised.to(valid.device)
        losses = torch.where(chosen, losses + ppo_kl_coef * log_ratio.abs(), losses)
    return PolicyLossTerms(losses, _metrics(response_mask, ppo_kl=log_ratio.abs()))
