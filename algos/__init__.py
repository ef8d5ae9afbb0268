"""PPO-family algorithms as pure functions over tensors, one module per idea.

- ``algos.advantages``: the advantage estimators and their registry (``ADV_ESTIMATORS``, ``compute_advantage``).
- ``algos.losses``: the PPO policy loss, the value loss, loss aggregation.
- ``algos.kl``: KL estimators, the exact KL, the in-reward KL penalty and its controllers.
- ``algos.stats``: masked statistics, log-probs and entropies from logits.
- ``algos.linear_logprob``: log-probs, entropies and the exact KL from hidden states and an LM head, in chunks of
  tokens (never the full-vocabulary logits), with its own backward.

Shapes are (bs, response_length) unless stated; ``response_mask`` is 1 on real response tokens. Nothing here
imports the rest of ColoRL: the driver computes advantages with it, the workers the losses.
"""

from algos.advantages import (
    ADV_ESTIMATORS,
    AdvEstimator,
    compute_advantage,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
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
from algos.losses import LOSS_AGG_MODES, POLICY_LOSS_MODES, agg_loss, compute_policy_loss, compute_value_loss
from algos.stats import (
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

__all__ = [
    "ADV_ESTIMATORS",
    "AdaptiveKLController",
    "AdvEstimator",
    "FixedKLController",
    "KLController",
    "KL_LOSS_TYPES",
    "KL_PENALTY_TYPES",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_MODES",
    "agg_loss",
    "apply_kl_penalty",
    "compute_advantage",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_policy_loss",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_value_loss",
    "entropy_from_logits",
    "estimator_needs_critic",
    "get_kl_controller",
    "kl_full",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "validate_adv_estimator",
]
