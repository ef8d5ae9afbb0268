"""Loss aggregation, the clipped value loss, and the policy-loss registry (``actor.policy_loss.loss_mode``).

A policy loss is a pure function from log-probs and advantages to a (bs, response_length) loss matrix plus
metrics (``algos.policy_losses``); ``compute_policy_loss`` reads its options from the actor config by the names
its registry entry lists, and aggregates the matrix (``agg_loss``). Metrics map namespaced names
(``actor/pg_loss``, ``critic/vf_loss``) to detached scalar tensors, so no host sync happens here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from typing import Any, NamedTuple

import torch
from torch import Tensor

from algos import policy_losses as pl
from algos import rollout_correction
from algos.registry import CLIP, LOSS_AGG_MODES, POLICY_LOSS_SPECS, policy_loss_spec
from algos.stats import masked_mean, masked_sum


def agg_loss(
    loss_mat: Tensor,
    loss_mask: Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: float | None = None,
    global_batch_size: float | None = None,
    loss_scale_factor: float | None = None,
) -> Tensor:
    """Reduce a (bs, response_length) loss matrix to a scalar (``agg_loss``).

    token-mean: Σ L·m / N;  token-sum: Σ L·m;  seq-mean-token-sum: Σ_i (Σ_t L·m) / S;
    seq-mean-token-mean: Σ_i (Σ_t L·m / Σ_t m) / S;  seq-mean-token-sum-norm: Σ_i (Σ_t L·m) / S / K (Dr.GRPO),
    with N the batch's tokens, S its sequences with at least one token, K = ``loss_scale_factor`` or the
    response length. Given the global mini-batch's ``batch_num_tokens`` and ``global_batch_size`` (which counts
    every sequence), the result is this micro-batch's share of the mini-batch's loss, times ``dp_size`` because
    data-parallel ranks average their gradients.
    """
    if loss_agg_mode == "token-mean":
        tokens = loss_mask.sum().clamp_min(1e-8) if batch_num_tokens is None else batch_num_tokens
        return masked_sum(loss_mat, loss_mask) / tokens * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid: {list(LOSS_AGG_MODES)}")
    seq_tokens = loss_mask.sum(dim=-1)
    seq_losses = masked_sum(loss_mat, loss_mask, dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_losses / (seq_tokens + 1e-8)
    seq_mask = (seq_tokens > 0).to(loss_mat.dtype)  # an empty sequence is no sequence
    sequences = seq_mask.sum().clamp_min(1.0) if global_batch_size is None else global_batch_size
    loss = masked_sum(seq_losses, seq_mask) / sequences * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return loss


def aggregate(
    loss_mat: Tensor,
    loss_mask: Tensor,
    loss_agg_mode: str,
    loss_scale_factor: float | None = None,
    global_batch: dict[str, float] | None = None,
) -> tuple[Tensor, Tensor]:
    """(the loss to backpropagate, its value on this batch alone for metrics), both via ``agg_loss``.

    ``global_batch`` holds ``agg_loss``'s dp_size, batch_num_tokens and global_batch_size of the mini-batch
    this micro-batch is part of; without it the two are the same.
    """
    local = agg_loss(loss_mat, loss_mask, loss_agg_mode, loss_scale_factor=loss_scale_factor)
    if not global_batch:
        return local, local.detach()
    share = agg_loss(loss_mat, loss_mask, loss_agg_mode, loss_scale_factor=loss_scale_factor, **global_batch)
    return share, local.detach()


class PolicyLoss(NamedTuple):
    """A policy-loss function, the config keys it reads and the batch inputs it needs beyond the PPO ones."""

    fn: Callable[..., pl.PolicyLossTerms]
    # keys under actor_rollout_ref.actor.policy_loss, else actor_rollout_ref.actor (dotted: a sub-section)
    options: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # e.g. rollout_log_probs (the rollout engine's per-token log-probs)
    agg_mode: str | None = None  # the aggregation it always uses; None: actor.loss_agg_mode


def _function(name: str) -> Callable[..., pl.PolicyLossTerms]:
    """The policy-loss function a registry entry names: one of ``algos.policy_losses``, or bypass mode's."""
    return getattr(pl, name, None) or getattr(rollout_correction, name)


# algos.registry's entries with their functions attached (the registry itself imports no torch)
POLICY_LOSSES: dict[str, PolicyLoss] = {
    name: PolicyLoss(_function(spec.fn), spec.options, spec.needs, spec.agg_mode)
    for name, spec in POLICY_LOSS_SPECS.items()
}


def validate_policy_loss(loss_mode: str) -> PolicyLoss:
    """The registry entry of ``loss_mode``; ValueError listing the valid names when there is none."""
    policy_loss_spec(loss_mode)  # the registry's check
    return POLICY_LOSSES[loss_mode]


def policy_loss_options(loss_mode: str, config: Any) -> dict[str, Any]:
    """The options ``loss_mode`` reads from an actor config: ``config.policy_loss.<name>``, else ``config.<name>``.

    A dotted name is read from that sub-section (its last part is the argument). ``clip_ratio_low`` /
    ``clip_ratio_high`` set to null fall back to ``clip_ratio``.
    """
    options = {}
    for name in validate_policy_loss(loss_mode).options:
        section = config.policy_loss if hasattr(config.policy_loss, name.partition(".")[0]) else config
        value = reduce(getattr, name.split("."), section)
        if name in CLIP and value is None:
            value = config.clip_ratio
        options[name.rpartition(".")[2]] = value
    return options


def compute_policy_loss(
    loss_mode: str,
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_log_probs: Tensor | None = None,
    global_batch: dict[str, float] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy loss named ``loss_mode`` (``POLICY_LOSSES``), aggregated: (scalar loss, metrics).

    Args:
        old_log_prob, log_prob: (bs, response_length) log-probs of the sampled tokens under the policy that
            sampled them and under the current policy (which carries the gradient).
        advantages: (bs, response_length), zero outside the mask.
        response_mask: (bs, response_length) 1 on response tokens, 0 on padding.
        loss_agg_mode: ``agg_loss``'s mode, unless the loss has its own (``PolicyLoss.agg_mode``).
        config: the actor config (``actor_rollout_ref.actor``) the loss's options are read from; None: the
            functions' defaults.
        rollout_log_probs: (bs, response_length), for the losses that need them (``PolicyLoss.needs``), which
            take them as the old policy's.
        global_batch: see ``aggregate``.

    Returns:
        (loss, metrics): the loss's own metrics plus actor/pg_loss, the aggregated loss of this batch alone.
    """
    entry = validate_policy_loss(loss_mode)
    options = {} if config is None else policy_loss_options(loss_mode, config)
    if "rollout_log_probs" in entry.needs:
        if rollout_log_probs is None:
            raise ValueError(f"policy loss_mode {loss_mode!r} needs rollout_log_probs")
        old_log_prob = rollout_log_probs  # bypass mode: the rollout engine's policy is the old one
    terms = entry.fn(old_log_prob, log_prob, advantages, response_mask, **options)
    mask = response_mask if terms.mask is None else terms.mask
    loss_scale_factor = None if config is None else config.loss_scale_factor
    loss, local = aggregate(terms.losses, mask, entry.agg_mode or loss_agg_mode, loss_scale_factor, global_batch)
    return loss, {**terms.metrics, "actor/pg_loss": local}


def compute_value_loss(
    vpreds: Tensor,
    returns: Tensor,
    values: Tensor,
    response_mask: Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    global_batch: dict[str, float] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss: 0.5·agg(max((V̂ − R)², (clip(V̂, V − c, V + c) − R)²)).

    Args:
        vpreds: (bs, response_length) V̂, the values being trained.
        returns: (bs, response_length) R, the targets from the advantage estimator.
        values: (bs, response_length) V, the values at rollout time (the clip's centre).
        response_mask: (bs, response_length) 1 on response tokens.
        cliprange_value: c, how far V̂ may move from V before its loss stops shrinking.
        loss_agg_mode, loss_scale_factor, global_batch: see ``agg_loss`` and ``aggregate``.

    Returns:
        (scalar loss, metrics): critic/vf_loss (this batch alone), critic/vf_clipfrac, critic/vpred_mean.
    """
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    loss1 = (vpreds - returns) ** 2
    loss2 = (vpred_clipped - returns) ** 2
    loss, local = aggregate(torch.maximum(loss1, loss2), response_mask, loss_agg_mode, loss_scale_factor, global_batch)
    with torch.no_grad():
        metrics = {
            "critic/vf_loss": 0.5 * local,
            "critic/vf_clipfrac": masked_mean((loss2 > loss1).float(), response_mask),
            "critic/vpred_mean": masked_mean(vpreds, response_mask),
        }
    return 0.5 * loss, metrics
