"""PPO-family algorithms as pure functions over tensors, one module per idea.

- ``algos.advantages``: the advantage estimators and their registry (``ADV_ESTIMATORS``, ``compute_advantage``);
  the group-baseline ones are in ``algos.group_estimators``.
- ``algos.losses``: loss aggregation, the value loss, the policy-loss registry (``POLICY_LOSSES``,
  ``compute_policy_loss``); the policy losses are in ``algos.policy_losses``, bypass mode's rollout
  correction in ``algos.rollout_correction``.
- ``algos.kl``: KL estimators, the exact KL, the in-reward KL penalty and its controllers.
- ``algos.stats``: masked statistics, log-probs and entropies from logits.
- ``algos.linear_logprob``: log-probs, entropies and the exact KL from hidden states and an LM head, in chunks of
  tokens (never the full-vocabulary logits), with its own backward.

Shapes are (bs, response_length) unless stated; ``response_mask`` is 1 on real response tokens. Nothing here
imports the rest of ColoRL: the driver computes advantages with it, the workers the losses.
"""

from algos.advantages import (
    ADV_ESTIMATORS,
    ESTIMATOR_INPUTS,
    AdvEstimator,
    compute_advantage,
    estimator_needs,
    estimator_needs_critic,
    validate_adv_estimator,
)
from algos.kl import (
    KL_LOSS_TYPES,
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_full,
    kl_penalty,
)
from algos.losses import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    PolicyLoss,
    agg_loss,
    aggregate,
    compute_policy_loss,
    compute_value_loss,
    policy_loss_options,
    validate_policy_loss,
)
from algos.stats import (
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    sum_pi_squared_from_logits,
)

__all__ = [
    "ADV_ESTIMATORS",
    "ESTIMATOR_INPUTS",
    "AdaptiveKLController",
    "AdvEstimator",
    "FixedKLController",
    "KLController",
    "KL_LOSS_TYPES",
    "KL_PENALTY_TYPES",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "PolicyLoss",
    "agg_loss",
    "aggregate",
    "apply_kl_penalty",
    "compute_advantage",
    "compute_policy_loss",
    "compute_value_loss",
    "entropy_from_logits",
    "estimator_needs",
    "estimator_needs_critic",
    "get_kl_controller",
    "kl_full",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "policy_loss_options",
    "sum_pi_squared_from_logits",
    "validate_adv_estimator",
    "validate_policy_loss",
]
