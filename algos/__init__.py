"""PPO-family algorithms as pure functions over tensors, one module per idea.

- ``algos.advantages``: the advantage estimators and their registry (``ADV_ESTIMATORS``, ``compute_advantage``);
  the group-baseline ones are in ``algos.group_estimators``.
- ``algos.losses``: loss aggregation, the value loss, the policy-loss registry (``POLICY_LOSSES``,
  ``compute_policy_loss``); the policy losses are in ``algos.policy_losses``, bypass mode's rollout
  correction in ``algos.rollout_correction``.
- ``algos.registry``: the registries' entries without their functions (names, the inputs each needs, the keys it
  reads), the KL types and aggregation modes: what the config layer reads, without torch.
- ``algos.kl``: KL estimators, the exact KL, the in-reward KL penalty and its controllers.
- ``algos.stats``: masked statistics, log-probs and entropies from logits.
- ``algos.linear_logprob``: log-probs, entropies and the exact KL from hidden states and an LM head, in chunks of
  tokens (never the full-vocabulary logits), with its own backward.

Shapes are (bs, response_length) unless stated; ``response_mask`` is 1 on real response tokens. Nothing here
imports the rest of ColoRL: the driver computes advantages with it, the workers the losses.

The names below (``algos.compute_advantage``, ``from algos import agg_loss``) load their module on first use
(PEP 562's module ``__getattr__``), so that importing ``algos.registry`` alone imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "advantages": ("ADV_ESTIMATORS", "AdvEstimator", "compute_advantage", "validate_adv_estimator"),
    "kl": (
        "AdaptiveKLController",
        "FixedKLController",
        "KLController",
        "apply_kl_penalty",
        "get_kl_controller",
        "kl_full",
        "kl_penalty",
    ),
    "losses": (
        "POLICY_LOSSES",
        "PolicyLoss",
        "agg_loss",
        "aggregate",
        "compute_policy_loss",
        "compute_value_loss",
        "policy_loss_options",
        "validate_policy_loss",
    ),
    "registry": (
        "ESTIMATOR_INPUTS",
        "KL_LOSS_TYPES",
        "KL_PENALTY_TYPES",
        "LOSS_AGG_MODES",
        "estimator_needs",
        "estimator_needs_critic",
    ),
    "stats": (
        "entropy_from_logits",
        "logprobs_from_logits",
        "masked_mean",
        "masked_sum",
        "masked_var",
        "masked_whiten",
        "sum_pi_squared_from_logits",
    ),
}
_MODULE_OF = {name: module for module, names in _NAMES.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'algos' has no attribute {name!r}")
    return getattr(importlib.import_module(f"algos.{_MODULE_OF[name]}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
