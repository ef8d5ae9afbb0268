"""Advantage estimators and their registry (``algorithm.adv_estimator``), by the names the config gives them.

Each takes ``token_level_rewards`` and ``response_mask`` (bs, response_length) plus what it needs (values,
group ids, greedy baselines, …) and returns ``(advantages, returns)``, both (bs, response_length), advantages
zero outside the mask. The group-baseline estimators live in ``algos.group_estimators``. ``ADV_ESTIMATORS``
lists, per name, the function, the inputs it needs (so the step plan knows which phases must run) and the
``algorithm.*`` keys it reads, from ``algos.registry``'s entries; ``compute_advantage`` dispatches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from algos import group_estimators as ge
from algos.registry import ESTIMATOR_INPUTS, ESTIMATORS, estimator_spec
from algos.stats import masked_whiten


@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float = 1.0, lam: float = 1.0
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


@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, gamma: float = 1.0
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025): G_t = r_t + γ·G_{t+1} over the masked tokens, A = whiten(G)·mask; returns = G·mask.

    A masked position (e.g. a tool's output between two turns) carries G_{t+1} through unchanged, so a reward
    after it still reaches the tokens before it.
    """
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[-1])):
        step = token_level_rewards[:, t] + gamma * running
        returns[:, t] = step * mask[:, t]
        running = step * mask[:, t] + running * (1 - mask[:, t])
    return masked_whiten(returns, mask) * mask, returns


@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: Tensor, reward_baselines: Tensor, response_mask: Tensor
) -> tuple[Tensor, Tensor]:
    """ReMax (Li et al. 2023): returns_t = Σ_{k≥t} r_k·m_k;  A_t = (returns_t − b)·m_t, b (bs,) = greedy reward."""
    returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    advantages = (returns - reward_baselines.unsqueeze(-1)) * response_mask
    return advantages, returns


@torch.no_grad()
def compute_optimal_token_baseline_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    old_log_probs: Tensor,
    sum_pi_squared: Tensor,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """Optimal token baseline (OTB): a per-position baseline weighted by each path's variance so far.

    G_t = Σ_{k≥t} r_k·m_k (returns);  w_t = 1 − 2π_t + Σ_v π(v)² (π_t = exp(old_log_probs), the sampled token's
    probability; ``sum_pi_squared`` (bs, response_length) from the actor's log-prob forward), W_t = Σ_{j≤t} w_j·m_j;
    B_t = Σ_g G_t·W_t·m_t / (Σ_g W_t·m_t + ε) over the prompt's group, A_t = (G_t − B_t)·m_t. A group of one has
    B = 0; with ``handle_zero_tail`` the group's single longest response gets B = 0 past the second-longest one's
    length, where it would be its own baseline.
    """
    returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    w = (1 - 2 * torch.exp(old_log_probs) + sum_pi_squared) * response_mask
    weight = w.cumsum(dim=-1) * response_mask
    group = ge.group_ids(index, returns.device)
    baselines = ge.group_sum(returns * weight, group) / (ge.group_sum(weight, group) + epsilon)
    sizes = ge.group_sum(torch.ones_like(returns[:, 0]), group)
    baselines = baselines.masked_fill((sizes == 1).unsqueeze(-1), 0.0)
    if handle_zero_tail:
        lengths = response_mask.sum(dim=-1)
        n_groups = len(group)  # at most one group per response: no read of the group count from the device
        longest = lengths.new_zeros(n_groups).scatter_reduce(0, group, lengths, "amax")[group]
        n_longest = ge.group_sum((lengths == longest).to(lengths.dtype), group)
        others = torch.where(lengths == longest, -1, lengths)
        second = others.new_full((n_groups,), -1).scatter_reduce(0, group, others, "amax")[group]
        alone_at_top = (lengths == longest) & (n_longest == 1) & (sizes > 1)
        tail = torch.arange(returns.shape[-1], device=returns.device) >= second.unsqueeze(-1)
        baselines = baselines.masked_fill(alone_at_top.unsqueeze(-1) & tail, 0.0)
    return (returns - baselines) * response_mask, returns


@torch.no_grad()
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    old_log_probs: Tensor,
    sum_pi_squared: Tensor,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """The optimal token baseline over the model's own tokens of a multi-turn response (TIR-OTB).

    A tool-calling response interleaves model tokens (mask 1) with tool output (mask 0). The baseline of
    :func:`compute_optimal_token_baseline_advantage` is aligned by position; here it is aligned by the k-th *model*
    token: each row's model tokens are packed to the left (order kept), OTB runs on the packed rows, and the
    advantages go back to their positions. returns = Σ_{k≥t} r_k·m_k at every position, as in OTB.
    """
    # a stable sort on (1 − m) puts each row's model tokens first, in their order
    order = torch.sort((1 - response_mask).to(torch.int8), dim=-1, stable=True).indices
    packed = [x.gather(-1, order) for x in (token_level_rewards, response_mask, old_log_probs, sum_pi_squared)]
    packed_adv, _ = compute_optimal_token_baseline_advantage(
        *packed[:2], index, *packed[2:], handle_zero_tail=handle_zero_tail, epsilon=epsilon
    )
    advantages = torch.zeros_like(packed_adv).scatter(-1, order, packed_adv) * response_mask
    returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    return advantages, returns


class AdvEstimator(NamedTuple):
    """An estimator function, the inputs of ``compute_advantage`` it needs, and the config keys it reads."""

    fn: Callable[..., tuple[Tensor, Tensor]]
    needs: tuple[str, ...]  # from ESTIMATOR_INPUTS
    options: tuple[str, ...] = ()  # algorithm.* keys


def _function(name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    """The estimator function a registry entry names: a group-baseline one, or one of this module's."""
    return getattr(ge, name, None) or globals()[name]


# algos.registry's entries with their functions attached (the registry itself imports no torch)
ADV_ESTIMATORS: dict[str, AdvEstimator] = {
    name: AdvEstimator(_function(spec.fn), spec.needs, spec.options) for name, spec in ESTIMATORS.items()
}


def validate_adv_estimator(name: str) -> AdvEstimator:
    """The registry entry of ``name``; ValueError listing the valid names when there is none."""
    estimator_spec(name)  # the registry's check
    return ADV_ESTIMATORS[name]


def compute_advantage(
    adv_estimator: str, *, token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, **given: Any
) -> tuple[Tensor, Tensor]:
    """Dispatch to the estimator named ``adv_estimator``; returns (advantages, returns), both (bs, response_length).

    ``given`` holds inputs (``ESTIMATOR_INPUTS``; those the estimator does not need are ignored) and options by
    name; an option not given is read from ``config`` (the ``algorithm`` config) when it has it, else the
    function's default applies.
    """
    est = validate_adv_estimator(adv_estimator)
    every_option = {name for entry in ADV_ESTIMATORS.values() for name in entry.options}
    unknown = set(given) - set(ESTIMATOR_INPUTS) - every_option
    if unknown:
        raise TypeError(f"compute_advantage got unknown arguments {sorted(unknown)}")
    missing = [name for name in est.needs if given.get(name) is None]
    if missing:
        raise ValueError(f"adv_estimator {adv_estimator!r} needs {missing} but got None")
    kwargs = {name: given[name] for name in est.needs}
    for name in est.options:
        if name in given:
            kwargs[name] = given[name]
        elif hasattr(config, name):
            kwargs[name] = getattr(config, name)
    return est.fn(token_level_rewards=token_level_rewards, response_mask=response_mask, **kwargs)
