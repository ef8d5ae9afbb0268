"""Advantage estimators: GAE, GRPO, RLOO, REINFORCE++ (with and without a group baseline) and ReMax.

Each takes ``token_level_rewards`` and ``response_mask`` (bs, response_length) plus what it needs (values, group
ids, greedy baselines) and returns ``(advantages, returns)``, both (bs, response_length), advantages zero outside
the mask. ``ADV_ESTIMATORS`` is the registry ``algorithm.adv_estimator`` names; ``compute_advantage`` dispatches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from algos.stats import masked_whiten


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
    """REINFORCE++ (Hu 2025): G_t = r_t + γ·G_{t+1} over the masked tokens, A = whiten(G)·mask; returns = G.

    A masked position carries G through unchanged (as in GAE), so tool turns inside a multi-turn response
    neither reset nor discount the return; after the last token the return is 0.
    """
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[-1])):
        m = mask[:, t]
        running = m * (token_level_rewards[:, t] + gamma * running) + (1 - m) * running
        returns[:, t] = running * m
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

