"""The policy's training and reference roles: the ``actor`` and ``ref`` sections, and the policy loss.

The keys ColoRL reads; some follow others by default (``rollout_n``, ``use_remove_padding``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

from algos.registry import KL_LOSS_TYPES, LOSS_AGG_MODES, POLICY_LOSS_SPECS
from config.checks import (
    ConfigError,
    check,
    is_number,
    non_negative,
    optional_positive_int,
    positive,
    positive_int,
)
from config.sections.engine import FSDPConfig, OptimConfig, RefFSDPConfig

LossAggMode = Literal[LOSS_AGG_MODES]  # type: ignore[valid-type]
PolicyLossMode = Literal[tuple(POLICY_LOSS_SPECS)]  # type: ignore[valid-type]
KLLossType = Literal[KL_LOSS_TYPES]  # type: ignore[valid-type]


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """``algorithm.rollout_correction``: importance weights and rejection between the rollout engine's
    policy and the trained one (``algos.rollout_correction``). Every switch needs the rollout's per-token
    log-probs (``rollout.calculate_log_probs``; ``planner.plan`` checks). ColoRL's rollout is the pre-update policy
    itself, so its log-probs are the old ones whenever computed: bypass mode is the only mode."""

    rollout_is: Literal["token", "sequence"] | None = None  # importance weights per token or per sequence
    rollout_is_threshold: Any = 2.0  # truncate at it, or "lower_upper": zero weights outside (IcePop)
    rollout_rs: str | None = None  # rejection options, comma-separated (e.g. "token_k1,seq_mean_k3")
    rollout_rs_threshold: Any = None
    # the rollout's log-probs are the old policy's; it makes the policy loss bypass_mode (as the config loads)
    bypass_mode: bool = False
    loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip"  # bypass mode's loss
    rollout_is_batch_normalize: bool = False


@dataclass(frozen=True)
class PolicyLossConfig:
    """``actor.policy_loss``: which loss (``algos.registry.POLICY_LOSS_SPECS``) and the options only some read."""

    loss_mode: PolicyLossMode = "vanilla"
    clip_cov_ratio: float = 0.0002  # clip_cov: the fraction of tokens detached
    clip_cov_lb: float = 1.0  # clip_cov: the covariance band tokens are drawn from
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002  # kl_cov: the fraction of tokens penalised
    ppo_kl_coef: float = 0.1  # kl_cov: the penalty's coefficient
    dro_beta: float | None = None  # dro: the quadratic log-ratio penalty's β (required)
    # bypass_mode reads these: algorithm.rollout_correction's
    rollout_correction: RolloutCorrectionConfig = "${algorithm.rollout_correction}"  # type: ignore[assignment]

    def __post_init__(self) -> None:
        positive(self, "clip_cov_ratio", "kl_cov_ratio")
        non_negative(self, "ppo_kl_coef")
        check(self, ["dro_beta"], lambda v: v is None or (is_number(v) and v > 0), "must be null or > 0")
        if self.loss_mode == "dro" and self.dro_beta is None:
            raise ConfigError.invalid(
                "dro_beta", None, "the dro loss needs its penalty coefficient β > 0 (e.g. policy_loss.dro_beta=0.1)"
            )


@dataclass(frozen=True)
class ActorConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    rollout_n: int = "${actor_rollout_ref.rollout.n}"  # type: ignore[assignment]
    ppo_mini_batch_size: int = 256  # prompts (global); × rollout.n / workers per rank (planner.plan)
    ppo_micro_batch_size_per_gpu: int | None = None  # sequences per forward/backward on one worker
    use_dynamic_bsz: bool = False  # micro-batches by token budget instead of ppo_micro_batch_size_per_gpu
    ppo_max_token_len_per_gpu: int = 16384  # valid tokens per micro-batch with use_dynamic_bsz
    clip_ratio: float = 0.2  # read only where clip_ratio_low/high are null
    clip_ratio_low: float | None = 0.2  # 0.2 (not clip_ratio); null -> clip_ratio
    clip_ratio_high: float | None = 0.2
    tau_pos: float = 1.0  # SAPO's gate temperature where the advantage is positive
    tau_neg: float = 1.05  # ... and where it is not
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages; DPPO's importance-weight truncation
    loss_agg_mode: LossAggMode = "token-mean"
    loss_scale_factor: float | None = None  # seq-mean-token-sum-norm's divisor; null -> the response length
    entropy_coeff: float = 0.0
    calculate_sum_pi_squared: bool = False  # return Σπ² with the old log-probs (on anyway when the estimator needs it)
    use_kl_loss: bool = False
    # the rows of a micro-batch that repeat a prompt (a GRPO group) run it once, its responses after it in one
    # packed row: the same log-probs and gradients, less compute (workers.compute.packing)
    use_prefix_grouper: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: KLLossType = "low_var_kl"
    ppo_epochs: int = 1
    shuffle: bool = False
    use_fused_kernels: bool = "${actor_rollout_ref.model.use_fused_kernels}"  # type: ignore[assignment]
    grad_clip: float = 1.0  # the gradient-norm clip
    use_remove_padding: bool = "${actor_rollout_ref.model.use_remove_padding}"  # type: ignore[assignment]
    # ColoRL: one optimizer step per batch (ppo_epochs 1, one mini-batch) is on-policy: the update's own log-probs,
    # detached, are the old ones, so the separate old-log-prob forward is skipped (as TRL does)
    skip_on_policy_old_log_prob: bool = True
    # ColoRL: torch.compile the whole policy forward (rollout, log-probs, update); pays off for small models on CPU
    # after a compile of about a minute, and recompiles when batch shapes change (docs/benchmarks.md)
    compile_model: bool = False

    def __post_init__(self) -> None:
        positive_int(self, "ppo_mini_batch_size", "ppo_epochs", "ppo_max_token_len_per_gpu")
        optional_positive_int(self, "ppo_micro_batch_size_per_gpu")
        positive(self, "clip_ratio", "grad_clip")
        check(
            self,
            ["clip_ratio_low", "clip_ratio_high"],
            lambda v: v is None or (is_number(v) and v > 0),
            "must be null (use clip_ratio) or > 0",
        )
        check(self, ["clip_ratio_c"], lambda v: is_number(v) and v > 1, "must be > 1")
        positive(self, "tau_pos", "tau_neg")
        check(self, ["loss_scale_factor"], lambda v: v is None or (is_number(v) and v > 0), "must be null or > 0")
        non_negative(self, "kl_loss_coef")
        low, high = self.clip_ratio_low, self.clip_ratio_high
        if self.clip_ratio != 0.2 and low is not None and high is not None and (low, high) != (self.clip_ratio,) * 2:
            warnings.warn(
                f"actor_rollout_ref.actor.clip_ratio={self.clip_ratio} is not used: clip_ratio_low={low} "
                f"and clip_ratio_high={high} are set (they default to 0.2, not clip_ratio); set them, "
                "or null to follow clip_ratio",
                stacklevel=2,
            )


@dataclass(frozen=True)
class RefConfig:
    rollout_n: int = "${actor_rollout_ref.rollout.n}"  # type: ignore[assignment]
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    log_prob_max_token_len_per_gpu: int = "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"  # type: ignore
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)

    def __post_init__(self) -> None:
        positive_int(self, "log_prob_max_token_len_per_gpu")
        optional_positive_int(self, "log_prob_micro_batch_size_per_gpu")
