"""The registries' entries without their functions: what the config layer reads, importable without torch.

Each advantage estimator and policy loss is one line here: its name (the config's), the name of its function, the batch
inputs it needs (so the step plan knows which phases must produce them) and the config keys it reads.
``algos.advantages.ADV_ESTIMATORS``, ``algos.losses.POLICY_LOSSES`` and ``algos.distillation.DISTILLATION_LOSSES``
attach the functions by those names. The KL types and the loss aggregation modes are listed here too. Loading,
checking and planning a config reads only this module, so a config mistake is reported before torch loads
(``main.py``).
"""

from __future__ import annotations

from typing import NamedTuple


class EstimatorSpec(NamedTuple):
    """An advantage estimator: its function's name (in ``algos.advantages`` or ``algos.group_estimators``), the
    inputs of ``compute_advantage`` it needs (``ESTIMATOR_INPUTS``) and the ``algorithm.*`` keys it reads."""

    fn: str
    needs: tuple[str, ...]
    options: tuple[str, ...] = ()


# what each input is, and so which phase of a step must produce it (planner.plan reads the registry)
ESTIMATOR_INPUTS = {
    "values": "the critic's values (bs, response_length)",
    "index": "each response's prompt group (uid): rollout.n > 1",
    "reward_baselines": "the reward of each prompt's greedy response (bs,)",
    "old_log_probs": "the sampling policy's log-probs (bs, response_length)",
    "sum_pi_squared": "Σ_v π(v)² at each response position, from the old-log-prob forward",
    "reward_components": "the compute_score dict's entries named by algorithm.gdpo_reward_keys, each (bs,)",
}
GROUP = ("index",)
GRPO_OPTIONS = ("norm_adv_by_std_in_grpo",)
OTB_NEEDS = (*GROUP, "old_log_probs", "sum_pi_squared")
ESTIMATORS: dict[str, EstimatorSpec] = {
    "gae": EstimatorSpec("compute_gae_advantage_return", ("values",), ("gamma", "lam")),
    "grpo": EstimatorSpec("compute_grpo_outcome_advantage", GROUP, GRPO_OPTIONS),
    "grpo_vectorized": EstimatorSpec("compute_grpo_vectorized_outcome_advantage", GROUP, GRPO_OPTIONS),
    "grpo_passk": EstimatorSpec("compute_grpo_passk_outcome_advantage", GROUP, GRPO_OPTIONS),
    "gdpo": EstimatorSpec(
        "compute_gdpo_outcome_advantage", (*GROUP, "reward_components"), ("gdpo_reward_weights", *GRPO_OPTIONS)
    ),
    "reinforce_plus_plus": EstimatorSpec("compute_reinforce_plus_plus_outcome_advantage", (), ("gamma",)),
    "reinforce_plus_plus_baseline": EstimatorSpec("compute_reinforce_plus_plus_baseline_outcome_advantage", GROUP),
    "rloo": EstimatorSpec("compute_rloo_outcome_advantage", GROUP),
    "rloo_vectorized": EstimatorSpec("compute_rloo_vectorized_outcome_advantage", GROUP),
    "opo": EstimatorSpec("compute_opo_outcome_advantage", GROUP),
    "gpg": EstimatorSpec("compute_gpg_outcome_advantage", GROUP),
    "remax": EstimatorSpec("compute_remax_outcome_advantage", ("reward_baselines",)),
    "optimal_token_baseline": EstimatorSpec("compute_optimal_token_baseline_advantage", OTB_NEEDS),
    "tir_optimal_token_baseline": EstimatorSpec("compute_multi_turn_optimal_token_baseline_advantage", OTB_NEEDS),
}


def estimator_spec(name: str) -> EstimatorSpec:
    """The registry entry of ``name``; ValueError listing the valid names when there is none."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown adv_estimator {name!r}; valid: {list(ESTIMATORS)}")
    return ESTIMATORS[name]


def estimator_needs(name: str, what: str) -> bool:
    """Whether estimator ``name`` needs the input ``what`` (a key of ``ESTIMATOR_INPUTS``)."""
    return what in estimator_spec(name).needs


def estimator_needs_critic(name: str) -> bool:
    """True when the estimator consumes critic values (only GAE)."""
    return estimator_needs(name, "values")


class PolicyLossSpec(NamedTuple):
    """A policy loss: its function's name (in ``algos.policy_losses`` or ``algos.rollout_correction``), the config
    keys it reads and the batch inputs it needs beyond the PPO ones."""

    fn: str
    # keys under actor_rollout_ref.actor.policy_loss, else actor_rollout_ref.actor (dotted: a sub-section)
    options: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # e.g. rollout_log_probs (the rollout engine's per-token log-probs)
    agg_mode: str | None = None  # the aggregation it always uses; None: actor.loss_agg_mode


CLIP = ("clip_ratio_low", "clip_ratio_high")
DUAL_CLIP = (*CLIP, "clip_ratio_c")
# the options compute_policy_loss_bypass_mode reads, under actor.policy_loss
ROLLOUT_CORRECTION_OPTIONS = tuple(
    f"rollout_correction.{name}"
    for name in (
        "loss_type",
        "rollout_is",
        "rollout_is_threshold",
        "rollout_is_batch_normalize",
        "rollout_rs",
        "rollout_rs_threshold",
    )
)
POLICY_LOSS_SPECS: dict[str, PolicyLossSpec] = {
    "vanilla": PolicyLossSpec("compute_policy_loss_vanilla", DUAL_CLIP),
    "gspo": PolicyLossSpec("compute_policy_loss_gspo", CLIP),
    "sapo": PolicyLossSpec("compute_policy_loss_sapo", ("tau_pos", "tau_neg"), agg_mode="seq-mean-token-mean"),
    "cispo": PolicyLossSpec("compute_policy_loss_cispo", CLIP),
    "gpg": PolicyLossSpec("compute_policy_loss_gpg"),
    "geo_mean": PolicyLossSpec("compute_policy_loss_geo_mean", CLIP, agg_mode="seq-mean-token-mean"),
    "dppo_tv": PolicyLossSpec("compute_policy_loss_dppo_tv", DUAL_CLIP),
    "dppo_kl": PolicyLossSpec("compute_policy_loss_dppo_kl", DUAL_CLIP),
    "dro": PolicyLossSpec("compute_policy_loss_dro", ("dro_beta",)),
    "clip_cov": PolicyLossSpec("compute_policy_loss_clip_cov", (*CLIP, "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub")),
    "kl_cov": PolicyLossSpec("compute_policy_loss_kl_cov", ("kl_cov_ratio", "ppo_kl_coef")),
    "bypass_mode": PolicyLossSpec(
        "compute_policy_loss_bypass_mode", (*DUAL_CLIP, *ROLLOUT_CORRECTION_OPTIONS), needs=("rollout_log_probs",)
    ),
}


def policy_loss_spec(loss_mode: str) -> PolicyLossSpec:
    """The registry entry of ``loss_mode``; ValueError listing the valid names when there is none."""
    if loss_mode not in POLICY_LOSS_SPECS:
        raise ValueError(f"unknown policy loss_mode {loss_mode!r}; valid: {list(POLICY_LOSS_SPECS)}")
    return POLICY_LOSS_SPECS[loss_mode]


LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
# "<estimator>+": the estimator's value with k2's gradient (straight-through, algos.kl.kl_penalty)
KL_PENALTY_TYPES = (*KL_ESTIMATORS, *(f"{name}+" for name in KL_ESTIMATORS))
KL_LOSS_TYPES = (*KL_PENALTY_TYPES, "full")  # "full" needs both models' logits: only the actor's KL loss has them


class DistillationLossSpec(NamedTuple):
    """An on-policy distillation loss: its per-token function's name (in ``algos.distillation``) and whether it
    reads the teacher's top-k log-probs (else: the sampled token's)."""

    fn: str
    uses_topk: bool


DISTILLATION_LOSS_SPECS: dict[str, DistillationLossSpec] = {
    **{mode: DistillationLossSpec("sampled_token_kl", uses_topk=False) for mode in KL_ESTIMATORS},
    "forward_kl_topk": DistillationLossSpec("forward_kl_topk", uses_topk=True),
}
