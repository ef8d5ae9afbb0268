"""PPO-family algorithms as pure functions over tensors.

Shapes: (bs, response_length) unless stated. ``response_mask`` is 1 on real response tokens, 0 on padding.
Advantage estimators return ``(advantages, returns)`` with advantages zero outside the mask; losses return
``(loss, metrics)`` where metrics maps namespaced names to detached scalar tensors (no host sync here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor

# --------------------------------------------------------------------------------------------- masked stats


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ values·mask over ``dim`` (all elements when None)."""
    return (values * mask).sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ values·mask / Σ mask over ``dim``; an all-masked slice gives 0 instead of NaN."""
    return masked_sum(values, mask, dim) / mask.sum(dim=dim).clamp_min(1e-8)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked elements (scalar), Bessel-corrected when ``unbiased``."""
    centered = values - masked_mean(values, mask)
    var = masked_mean(centered**2, mask)
    if unbiased:
        n = mask.sum()
        if n < 2:
            raise ValueError(f"masked_var(unbiased=True) needs at least 2 unmasked elements, got {n.item()}")
        var = var * n / (n - 1)
    return var


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """(values − mean) / sqrt(var + 1e-8) with masked statistics; keeps the mean when not ``shift_mean``."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


# ----------------------------------------------------------------------------------- advantage estimators


@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016). All inputs (bs, response_length).

    δ_t = r_t + γ·V_{t+1} − V_t,  A_t = δ_t + γλ·A_{t+1} (backward scan),  returns = A + V,
    then advantages = whiten(A) over the mask. Masked positions carry V_{t+1} and A_{t+1} through unchanged,
    so padding anywhere in the row does not break the recursion.
    """
    mask = response_mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])
    last_gae = torch.zeros_like(values[:, 0])
    advantages_reversed = []
    for t in reversed(range(values.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        gae = delta + gamma * lam * last_gae
        m = mask[:, t]
        next_value = m * values[:, t] + (1 - m) * next_value
        last_gae = m * gae + (1 - m) * last_gae
        advantages_reversed.append(last_gae)
    advantages = torch.stack(advantages_reversed[::-1], dim=-1)
    returns = advantages + values
    return masked_whiten(advantages, mask) * mask, returns


def _group_mean_std(scores: Tensor, index: np.ndarray) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample (mean, unbiased std, size) of the sample's group; ``index`` (bs,) holds group ids (uids)."""
    _, inverse = np.unique(np.asarray(index), return_inverse=True)
    group = torch.as_tensor(inverse.reshape(-1), device=scores.device)
    n_groups = int(group.max()) + 1
    zeros = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device)
    count = zeros.index_add(0, group, torch.ones_like(scores))
    total = zeros.index_add(0, group, scores)
    mean = (total / count)[group]
    sq_dev = zeros.index_add(0, group, (scores - mean) ** 2)
    std = (sq_dev / (count - 1).clamp_min(1)).sqrt()[group]
    return mean, std, count[group]


@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[Tensor, Tensor]:
    """GRPO (Shao et al. 2024): s = Σ_t r_t;  A = (s − mean_g) / (std_g + ε), or s − mean_g (Dr.GRPO).

    std is unbiased; a group of one uses mean 0 and std 1. A is broadcast over the response tokens; returns = A.
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, std, count = _group_mean_std(scores, index)
    single = count == 1
    mean, std = mean.masked_fill(single, 0.0), std.masked_fill(single, 1.0)
    adv = scores - mean
    if norm_adv_by_std_in_grpo:
        adv = adv / (std + epsilon)
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, index: np.ndarray, epsilon: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al. 2024): A_i = s_i − mean_{j≠i, j∈g} s_j = (s_i − mean_g)·n/(n−1); groups of 1 get 0.

    ``epsilon`` is accepted for a signature shared with GRPO and not used: the leave-one-out baseline has no
    division that could vanish. returns = A.
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, _, count = _group_mean_std(scores, index)
    adv = torch.where(count > 1, (scores - mean) * count / (count - 1).clamp_min(1), torch.zeros_like(scores))
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, gamma: float
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025): G_t = (r_t + γ·G_{t+1})·m_t (reset on padding),  A = whiten(G)·mask; returns = G."""
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[-1])):
        running = (token_level_rewards[:, t] + gamma * running) * mask[:, t]
        returns[:, t] = running
    return masked_whiten(returns, mask) * mask, returns


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, index: np.ndarray, epsilon: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a group baseline: A = whiten((s − mean_g) over tokens)·mask; returns = A.

    A group of one uses mean 0. ``epsilon`` is accepted for a signature shared with GRPO; the batch
    whitening supplies its own stabiliser.
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, _, count = _group_mean_std(scores, index)
    tiled = (scores - mean.masked_fill(count == 1, 0.0)).unsqueeze(-1) * response_mask
    advantages = masked_whiten(tiled, response_mask) * response_mask
    return advantages, advantages


@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: Tensor, reward_baselines: Tensor, response_mask: Tensor
) -> tuple[Tensor, Tensor]:
    """ReMax (Li et al. 2023): returns_t = Σ_{k≥t} r_k·m_k;  A_t = (returns_t − b)·m_t, b (bs,) = greedy reward."""
    returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    advantages = (returns - reward_baselines.unsqueeze(-1)) * response_mask
    return advantages, returns


class AdvEstimator(NamedTuple):
    """An estimator function plus which of compute_advantage's optional arguments it takes."""

    fn: Callable[..., tuple[Tensor, Tensor]]
    needs: tuple[str, ...]  # optional inputs of compute_advantage this estimator cannot do without
    options: tuple[str, ...] = ()  # scalar hyper-parameters it takes


ADV_ESTIMATORS: dict[str, AdvEstimator] = {
    "gae": AdvEstimator(compute_gae_advantage_return, ("values",), ("gamma", "lam")),
    "grpo": AdvEstimator(compute_grpo_outcome_advantage, ("index",), ("norm_adv_by_std_in_grpo",)),
    "reinforce_plus_plus": AdvEstimator(compute_reinforce_plus_plus_outcome_advantage, (), ("gamma",)),
    "reinforce_plus_plus_baseline": AdvEstimator(compute_reinforce_plus_plus_baseline_outcome_advantage, ("index",)),
    "rloo": AdvEstimator(compute_rloo_outcome_advantage, ("index",)),
    "remax": AdvEstimator(compute_remax_outcome_advantage, ("reward_baselines",)),
}


def validate_adv_estimator(name: str) -> None:
    """Raise ValueError listing the valid names when ``name`` is not a known advantage estimator."""
    if name not in ADV_ESTIMATORS:
        raise ValueError(f"unknown adv_estimator {name!r}; valid: {sorted(ADV_ESTIMATORS)}")


def estimator_needs_critic(name: str) -> bool:
    """True when the estimator consumes critic values (only GAE)."""
    validate_adv_estimator(name)
    return "values" in ADV_ESTIMATORS[name].needs


def compute_advantage(
    adv_estimator: str,
    *,
    token_level_rewards: Tensor,
    response_mask: Tensor,
    values: Tensor | None = None,
    index: np.ndarray | None = None,
    reward_baselines: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[Tensor, Tensor]:
    """Dispatch to the estimator named ``adv_estimator``; returns (advantages, returns), both (bs, response_length)."""
    validate_adv_estimator(adv_estimator)
    est = ADV_ESTIMATORS[adv_estimator]
    inputs = dict(
        values=values,
        index=index,
        reward_baselines=reward_baselines,
        gamma=gamma,
        lam=lam,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
    )
    missing = [k for k in est.needs if inputs[k] is None]
    if missing:
        raise ValueError(f"adv_estimator {adv_estimator!r} needs {missing} but got None")
    kwargs = {k: inputs[k] for k in est.needs + est.options}
    return est.fn(token_level_rewards=token_level_rewards, response_mask=response_mask, **kwargs)


# --------------------------------------------------------------------------------------------------- losses

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

    L1 = −A·ρ,  L2 = −A·clip(ρ, 1−ε_low, 1+ε_high),  L = max(L1, L2);  for A < 0: L = min(L, −A·c).
    Inputs (bs, response_length). Metrics: actor/pg_loss, actor/pg_clipfrac, actor/ppo_kl, actor/pg_clipfrac_lower.
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
    """Clipped value loss: 0.5·agg(max((V̂ − R)², (clip(V̂, V − c, V + c) − R)²)); V = values at rollout time.

    Inputs (bs, response_length). Metrics: critic/vf_loss, critic/vf_clipfrac, critic/vpred_mean.
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


# ------------------------------------------------------------------------------------------ log-probs & KL


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy (...) of softmax(logits (..., V)): H = logsumexp(z) − Σ softmax(z)·z (no log of tiny probs)."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(logits)[labels]: (..., V), (...) -> (...); gathers first, so no (..., V) log-softmax is kept."""
    picked = logits.gather(dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


KL_PENALTY_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_LOSS_TYPES = (*KL_PENALTY_TYPES, "full")  # "full" needs both models' logits: only the actor's KL loss has them


def kl_penalty(logprob: Tensor, ref_logprob: Tensor, kl_penalty: str) -> Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from sampled-token log-probs (Schulman's k1/k2/k3), (bs, response_length).

    k1 = log π − log π_ref;  abs = |k1|;  k2 = ½·k1²;  k3 = e^{−k1} + k1 − 1 (≥ 0, low variance, clamped to ±10).
    The exact KL over the vocabulary is ``kl_full``, which takes logits instead.
    """
    log_ratio = logprob - ref_logprob
    if kl_penalty in ("kl", "k1"):
        return log_ratio
    if kl_penalty == "abs":
        return log_ratio.abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * log_ratio.square()
    if kl_penalty in ("low_var_kl", "k3"):
        ref_minus_logp = (-log_ratio).clamp(-20.0, 20.0)
        return (torch.exp(ref_minus_logp) - ref_minus_logp - 1).clamp(-10.0, 10.0)
    if kl_penalty == "full":
        raise ValueError("kl_penalty 'full' needs logits, not token log-probs: use kl_full(logits, ref_logits)")
    raise ValueError(f"unknown kl_penalty {kl_penalty!r}; valid: {list(KL_PENALTY_TYPES)}")


def kl_full(logits: Tensor, ref_logits: Tensor) -> Tensor:
    """Exact per-position KL(π ‖ π_ref) over the whole vocabulary: (..., V), (..., V) -> (...).

    KL_t = Σ_v π(v|s_t)·(log π(v|s_t) − log π_ref(v|s_t)),  π = softmax(logits), π_ref = softmax(ref_logits).
    No sampling noise, unlike k1/k2/k3; the gradient flows through ``logits`` only.
    """
    log_p = torch.log_softmax(logits, dim=-1)
    log_q = torch.log_softmax(ref_logits.detach(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


class KLController(Protocol):
    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...
    def state_dict(self) -> dict[str, float]: ...
    def load_state_dict(self, state: dict[str, float]) -> None: ...


class FixedKLController:
    """Constant KL coefficient β."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """A fixed coefficient ignores the observed KL."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController(FixedKLController):
    """Adaptive β (Ziegler et al. 2019): e = clip(KL/target − 1, ±0.2);  β ← β·(1 + e·n_steps/horizon)."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if horizon <= 0 or target_kl <= 0:
            raise ValueError(f"adaptive KL needs horizon > 0 and target_kl > 0, got {horizon=} {target_kl=}")
        super().__init__(init_kl_coef)
        self.target, self.horizon = float(target_kl), float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


def get_kl_controller(
    type: str, kl_coef: float, target_kl: float = 0.1, horizon: float = 10000
) -> FixedKLController | AdaptiveKLController:
    """Build the controller named by ``type`` ("fixed" | "adaptive"); argument names follow the kl_ctrl config keys."""
    if type == "fixed":
        return FixedKLController(kl_coef)
    if type == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown kl_ctrl type {type!r}; valid: ['fixed', 'adaptive']")


def apply_kl_penalty(
    token_level_scores: Tensor,
    old_log_probs: Tensor,
    ref_log_prob: Tensor,
    response_mask: Tensor,
    kl_ctrl: KLController,
    kl_penalty_type: str,
) -> tuple[Tensor, dict[str, float]]:
    """In-reward KL: r_t = score_t − β·KL_t·m_t, then adapt β with the batch's mean per-sequence KL.

    Inputs (bs, response_length). Metrics (β is the value used, before the update): actor/reward_kl_penalty,
    actor/reward_kl_penalty_coeff.
    """
    kld = kl_penalty(old_log_probs, ref_log_prob, kl_penalty_type) * response_mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = masked_mean(kld, response_mask, dim=-1).mean().item()
    kl_ctrl.update(current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
