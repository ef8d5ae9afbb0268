"""KL to the reference policy: per-token estimators from sampled-token log-probs (k1/k2/k3), the exact KL over
the vocabulary, and the in-reward penalty with its fixed or adaptive coefficient β.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from algos.registry import KL_PENALTY_TYPES
from algos.stats import masked_mean


def kl_penalty(logprob: Tensor, ref_logprob: Tensor, kl_penalty: str) -> Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from sampled-token log-probs (Schulman's k1/k2/k3), (bs, response_length).

    k1 = log π − log π_ref;  abs = |k1|;  k2 = ½·k1²;  k3 = e^{−k1} + k1 − 1 (≥ 0, low variance, clamped to ±10).
    A name with ``+`` (``k3+``, ``low_var_kl+``, ...) is straight-through: the estimator's value with k2's gradient,

        est⁺ = sg(est) + k2 − sg(k2)          (sg: stop-gradient)

    since k2's gradient, k1·∇log π, is the one whose expectation is KL's gradient (k1's and k3's are not).
    The exact KL over the vocabulary is ``kl_full``, which takes logits instead.
    """
    base = kl_penalty.removesuffix("+")
    value = _estimate(logprob - ref_logprob, base, kl_penalty)
    if base == kl_penalty or base in ("mse", "k2"):
        return value
    k2 = 0.5 * (logprob - ref_logprob).square()
    return value.detach() + k2 - k2.detach()


def _estimate(log_ratio: Tensor, kl_penalty: str, name: str) -> Tensor:
    """The estimator ``kl_penalty`` (no ``+``) of ``log_ratio``; ``name`` is the one asked for, for the errors."""
    if kl_penalty in ("kl", "k1"):
        return log_ratio
    if kl_penalty == "abs":
        return log_ratio.abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * log_ratio.square()
    if kl_penalty in ("low_var_kl", "k3"):
        ref_minus_logp = (-log_ratio).clamp(-20.0, 20.0)
        return (torch.exp(ref_minus_logp) - ref_minus_logp - 1).clamp(-10.0, 10.0)
    if name == "full":
        raise ValueError("kl_penalty 'full' needs logits, not token log-probs: use kl_full(logits, ref_logits)")
    raise ValueError(f"unknown kl_penalty {name!r}; valid: {list(KL_PENALTY_TYPES)}")


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
