"""On-policy distillation losses (``distillation.distillation_loss``): the student samples a response,
a frozen teacher scores every sampled token, and the student minimises a per-token divergence to the teacher.

Two kinds, by ``loss_mode`` (``DISTILLATION_LOSSES``):

- sampled-token estimators of the reverse KL(π ‖ ν) (π the student, ν the teacher) at the token y_t the student
  sampled, from the two log-probs of that token, (bs, response_length) each; with d = log π(y_t) − log ν(y_t):
  ``k1``/``kl`` = d,  ``abs`` = |d|,  ``k2``/``mse`` = ½d²,  ``k3``/``low_var_kl`` = e^{−d} + d − 1 (clamped as
  ``algos.kl.kl_penalty``, which computes them with the teacher in the reference's place);
- ``forward_kl_topk``: Σ_{v ∈ top-k(ν)} ν(v)·(log ν(v) − log π(v)) over the teacher's k most likely tokens, from the
  teacher's top-k log-probs and the student's log-probs of the same token ids, (bs, response_length, k) each; log
  probabilities are clamped below at ``log_prob_min_clamp`` first, and the result at 0 (the k tokens do not sum to 1,
  so the truncated sum can dip below 0).

``distillation_loss`` turns the per-token losses into the loss to backpropagate: clamped to ±``loss_max_clamp``,
then either used as a reward (``use_policy_gradient``: PPO's clipped loss with advantage −sg(loss) and the
distillation's own clip ratios, "PG OPD") or aggregated directly with ``actor.loss_agg_mode`` ("GKD OPD").
``combine_with_policy_loss`` adds it to the task's policy loss (``use_task_rewards``) or replaces it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from algos.kl import kl_penalty
from algos.losses import aggregate
from algos.policy_losses import compute_policy_loss_vanilla
from algos.registry import DISTILLATION_LOSS_SPECS
from algos.stats import masked_mean


class DistillationLoss(NamedTuple):
    """A registry entry: the per-token loss function and whether it reads top-k log-probs (else: the sampled
    token's)."""

    fn: Callable[..., tuple[Tensor, dict[str, Tensor]]]
    uses_topk: bool


def sampled_token_kl(
    student_log_probs: Tensor, teacher_log_probs: Tensor, response_mask: Tensor, loss_mode: str
) -> tuple[Tensor, dict[str, Tensor]]:
    """(bs, R) reverse-KL estimate per sampled token (module docstring) and ``distillation/abs_loss``, the masked
    mean of its absolute value (k1 can be negative)."""
    losses = kl_penalty(student_log_probs, teacher_log_probs, loss_mode)
    return losses, {"distillation/abs_loss": masked_mean(losses.detach().abs(), response_mask)}


def forward_kl_topk(
    student_topk_log_probs: Tensor,
    teacher_topk_log_probs: Tensor,
    response_mask: Tensor,
    log_prob_min_clamp: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """(bs, R) truncated forward KL over the teacher's top-k tokens (module docstring), from (bs, R, k) log-probs
    of the same token ids under the student and the teacher. Metrics: the probability mass the k tokens hold under
    each, ``distillation/{student,teacher}_mass`` (mean, and ``_min``/``_max``, over response tokens)."""
    student_mass = student_topk_log_probs.detach().exp().sum(-1)
    teacher_mass = teacher_topk_log_probs.detach().exp().sum(-1)
    student, teacher = student_topk_log_probs.float(), teacher_topk_log_probs.float()
    if log_prob_min_clamp is not None:
        student, teacher = student.clamp_min(log_prob_min_clamp), teacher.clamp_min(log_prob_min_clamp)
    losses = (teacher.exp() * (teacher - student)).sum(-1).clamp_min(0.0)
    valid = response_mask.bool()
    metrics = {}
    for name, mass in (("student", student_mass), ("teacher", teacher_mass)):
        metrics[f"distillation/{name}_mass"] = masked_mean(mass, response_mask)
        # on the device (no read of ``valid``): 0 without a valid token
        lowest, highest = mass.masked_fill(~valid, float("inf")).min(), mass.masked_fill(~valid, float("-inf")).max()
        metrics[f"distillation/{name}_mass_min"] = torch.where(valid.any(), lowest, 0.0)
        metrics[f"distillation/{name}_mass_max"] = torch.where(valid.any(), highest, 0.0)
    return losses, metrics


# algos.registry's entries with their functions attached (the registry itself imports no torch)
DISTILLATION_LOSSES: dict[str, DistillationLoss] = {
    name: DistillationLoss(globals()[spec.fn], spec.uses_topk) for name, spec in DISTILLATION_LOSS_SPECS.items()
}


def distillation_token_losses(
    loss_mode: str,
    response_mask: Tensor,
    student_log_probs: Tensor | None = None,
    teacher_log_probs: Tensor | None = None,
    student_topk_log_probs: Tensor | None = None,
    teacher_topk_log_probs: Tensor | None = None,
    log_prob_min_clamp: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The (bs, R) per-token losses of ``loss_mode`` from the inputs its entry reads: the sampled token's log-probs
    (bs, R) under student and teacher, or the (bs, R, k) log-probs of the teacher's top-k ids under both."""
    if loss_mode not in DISTILLATION_LOSSES:
        raise ValueError(f"unknown distillation loss_mode {loss_mode!r}; valid: {list(DISTILLATION_LOSSES)}")
    if DISTILLATION_LOSSES[loss_mode].uses_topk:
        return forward_kl_topk(student_topk_log_probs, teacher_topk_log_probs, response_mask, log_prob_min_clamp)
    return sampled_token_kl(student_log_probs, teacher_log_probs, response_mask, loss_mode)


def distillation_loss(
    token_losses: Tensor,
    response_mask: Tensor,
    config: Any,
    loss_agg_mode: str = "token-mean",
    log_prob: Tensor | None = None,
    old_log_prob: Tensor | None = None,
    loss_scale_factor: float | None = None,
    global_batch: dict[str, float] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The scalar distillation loss of (bs, R) ``token_losses`` and its metrics; ``config`` is
    ``distillation.distillation_loss`` (``loss_max_clamp``, ``use_policy_gradient``, ``clip_ratio_low/high``).

    ``distillation/loss_min``/``_max`` are over response tokens before the clamp. With ``use_policy_gradient`` the
    loss is PPO's clipped loss of ``log_prob`` against ``old_log_prob`` (bs, R) with advantages −sg(loss), its
    metrics ``distillation/pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower`` and ``pg_loss``; ``distillation/loss``
    is the loss's value on this batch alone. ``global_batch``: ``algos.losses.aggregate``'s.
    """
    valid = response_mask.bool()
    detached = token_losses.detach()
    metrics = {
        "distillation/loss_min": detached[valid].min() if valid.any() else detached.new_zeros(()),
        "distillation/loss_max": detached[valid].max() if valid.any() else detached.new_zeros(()),
    }
    if config.loss_max_clamp is not None:  # both sides: k1 can be negative
        token_losses = token_losses.clamp(-config.loss_max_clamp, config.loss_max_clamp)
    if config.use_policy_gradient:  # the negative divergence is the reward of each token
        terms = compute_policy_loss_vanilla(
            old_log_prob,
            log_prob,
            -token_losses.detach(),
            response_mask,
            clip_ratio_low=config.clip_ratio_low,
            clip_ratio_high=config.clip_ratio_high,
        )
        loss, local = aggregate(terms.losses, response_mask, loss_agg_mode, loss_scale_factor, global_batch)
        metrics.update({name.replace("actor/", "distillation/"): v for name, v in terms.metrics.items()})
        metrics["distillation/pg_loss"] = local
    else:  # the divergence itself, backpropagated through the student's log-probs
        loss, local = aggregate(token_losses, response_mask, loss_agg_mode, loss_scale_factor, global_batch)
    metrics["distillation/loss"] = local
    return loss, metrics


def combine_with_policy_loss(policy_loss: Tensor, distill_loss: Tensor, config: Any) -> Tensor:
    """The actor's loss: the task's policy loss + ``distillation_loss_coef`` × the distillation loss when
    ``use_task_rewards``, else the distillation loss alone (coefficient 1)."""
    if config.use_task_rewards:
        return policy_loss + config.distillation_loss_coef * distill_loss
    return distill_loss


def topk_log_probs_from_logits(logits: Tensor, ids: Tensor) -> Tensor:
    """(..., k) log-probs of token ``ids`` (..., k) under ``logits`` (..., V): log softmax(logits) gathered at ids.
    The reference for the fused path, which gathers them from hidden states in chunks."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, ids)
