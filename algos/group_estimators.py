"""Outcome advantage estimators whose baseline comes from the other responses to the same prompt.

Each takes ``token_level_rewards`` and ``response_mask`` (bs, response_length) and ``index`` (bs,), the group
(prompt uid) of each response, and returns ``(advantages, returns)``, both (bs, response_length) and zero
outside the mask. s_i = Σ_t r_i,t is response i's score; g(i) its group, of n responses.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from algos.stats import masked_whiten


def group_ids(index: np.ndarray, device: torch.device) -> Tensor:
    """(bs,) long tensor 0..G-1 naming each response's group; ``index`` holds any hashable ids (uids)."""
    _, inverse = np.unique(np.asarray(index), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), device=device)


def group_sum(values: Tensor, group: Tensor) -> Tensor:
    """Σ of ``values`` (bs, ...) over each response's group, per response: (bs, ...)."""
    # as many sums as responses (no group is empty of them): the group count needs no read from the device
    return values.new_zeros(values.shape).index_add(0, group, values)[group]


def group_mean_std(scores: Tensor, index: np.ndarray) -> tuple[Tensor, Tensor, Tensor]:
    """Per response: the (mean, unbiased std, size) of its group's scores."""
    group = group_ids(index, scores.device)
    count = group_sum(torch.ones_like(scores), group)
    mean = group_sum(scores, group) / count
    std = (group_sum((scores - mean) ** 2, group) / (count - 1).clamp_min(1)).sqrt()
    return mean, std, count


def _broadcast(per_response: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    advantages = per_response.unsqueeze(-1) * response_mask
    return advantages, advantages


@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[Tensor, Tensor]:
    """GRPO (Shao et al. 2024): A_i = (s_i − mean_g) / (std_g + ε), or s_i − mean_g (Dr.GRPO, ``norm…=False``).

    std is unbiased; a group of one uses mean 0 and std 1. A is broadcast over the response tokens; returns = A.
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, std, count = group_mean_std(scores, index)
    single = count == 1
    mean, std = mean.masked_fill(single, 0.0), std.masked_fill(single, 1.0)
    adv = scores - mean
    return _broadcast(adv / (std + epsilon) if norm_adv_by_std_in_grpo else adv, response_mask)


# the "grpo_vectorized" estimator: the same advantages (the function above is vectorized already)
compute_grpo_vectorized_outcome_advantage = compute_grpo_outcome_advantage


@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[Tensor, Tensor]:
    """Pass@k (Chen et al. 2025, arXiv 2503.19595): only each group's best response learns.

    A_best = s_max − s_second (÷ (std_g + ε) with ``norm_adv_by_std_in_grpo``), every other response 0; the best
    is ``torch.topk``'s first pick among the group's scores in batch order. Every group needs ≥ 2 responses.
    """
    scores = token_level_rewards.sum(dim=-1)
    advantages = torch.zeros_like(scores)
    _, group = np.unique(np.asarray(index), return_inverse=True)  # on the host: no read from the device
    group = group.reshape(-1)
    for g in range(group.max() + 1 if len(group) else 0):
        rows = torch.as_tensor(np.flatnonzero(group == g), device=scores.device)
        if len(rows) < 2:
            raise ValueError(f"grpo_passk needs at least 2 responses per prompt, got {len(rows)}")
        top = torch.topk(scores[rows], 2)
        best = top.values[0] - top.values[1]
        best = best / (scores[rows].std() + epsilon) if norm_adv_by_std_in_grpo else best
        advantages[rows[top.indices[:1]]] = best  # a 1-element index: a 0-d one would be read on the host
    return _broadcast(advantages, response_mask)


@torch.no_grad()
def compute_gdpo_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    reward_components: Sequence[Tensor] | None = None,
    gdpo_reward_weights: Sequence[float] | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[Tensor, Tensor]:
    """GDPO (arXiv 2601.05242): GRPO on each reward component separately, then a weighted sum, whitened.

    A = whiten(Σ_k w_k·GRPO(c_k)) over the batch's tokens, with c_k (bs,) the k-th component of each response's
    reward (``algorithm.gdpo_reward_keys``; none: the total score) and w_k = ``gdpo_reward_weights`` (default 1).
    A dominant component cannot drown the others, since each is normalised within its group first.
    """
    components = (
        [token_level_rewards]
        if reward_components is None
        else [c.reshape(len(c), -1).to(token_level_rewards) for c in reward_components]
    )
    weights = [1.0] * len(components) if gdpo_reward_weights is None else list(gdpo_reward_weights)
    if len(weights) != len(components):
        raise ValueError(f"gdpo_reward_weights has {len(weights)} weights for {len(components)} reward components")
    total = sum(
        w * compute_grpo_outcome_advantage(c, response_mask, index, epsilon, norm_adv_by_std_in_grpo)[0]
        for w, c in zip(weights, components)
    )
    advantages = masked_whiten(total, response_mask) * response_mask
    return advantages, advantages


def _leave_one_out(
    token_level_rewards: Tensor, response_mask: Tensor, index: np.ndarray, single: float | None
) -> tuple[Tensor, Tensor]:
    scores = token_level_rewards.sum(dim=-1)
    mean, _, count = group_mean_std(scores, index)
    alone = scores if single is None else single
    return _broadcast(torch.where(count > 1, (scores - mean) * count / (count - 1).clamp_min(1), alone), response_mask)


@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al. 2024): A_i = s_i − mean_{j≠i, j∈g} s_j = (s_i − mean_g)·n/(n−1); returns = A.

    A group of one keeps its score, A_i = s_i (``rloo``). ``epsilon`` is accepted for a signature shared
    with GRPO and not used: the leave-one-out baseline has no division that could vanish.
    """
    return _leave_one_out(token_level_rewards, response_mask, index, single=None)


@torch.no_grad()
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """RLOO as ``rloo_vectorized``: the same, except that a group of one gets A = 0."""
    return _leave_one_out(token_level_rewards, response_mask, index, single=0.0)


@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """OPO (Hao et al. 2025): the length-weighted group mean as baseline, b_g = Σ_g |y_j|·s_j / Σ_g |y_j|.

    A_i = s_i − b_g(i) (a group of one: b = 0). ``epsilon`` is accepted for the shared signature. returns = A.
    """
    scores = token_level_rewards.sum(dim=-1)
    lengths = response_mask.sum(dim=-1).to(scores.dtype)
    group = group_ids(index, scores.device)
    baseline = group_sum(lengths * scores, group) / group_sum(lengths, group)
    single = group_sum(torch.ones_like(scores), group) == 1
    return _broadcast(scores - baseline.masked_fill(single, 0.0), response_mask)


@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """GPG (Chu et al. 2025): A_i = α·(s_i − mean_g), α = bs / #{i : s_i ≠ 0} (at least 1), no std division.

    α scales the batch's gradient back up when most responses score 0. A group of one uses mean 0. returns = A.
    """
    scores = token_level_rewards.sum(dim=-1)
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
    mean, _, count = group_mean_std(scores, index)
    return _broadcast(alpha * (scores - mean.masked_fill(count == 1, 0.0)), response_mask)


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a group baseline: A = whiten((s − mean_g) over tokens)·mask; returns = A.

    A group of one uses mean 0. ``epsilon`` is accepted for a signature shared with GRPO; the batch
    whitening supplies its own stabiliser.
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, _, count = group_mean_std(scores, index)
    tiled = (scores - mean.masked_fill(count == 1, 0.0)).unsqueeze(-1) * response_mask
    advantages = masked_whiten(tiled, response_mask) * response_mask
    return advantages, advantages
