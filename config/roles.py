"""The worker roles' configuration: model, optimizer, FSDP, actor, rollout, reference, critic, reward model.

One frozen dataclass per component is the single home of its defaults (``config.schema`` holds the rest and the
root). Choices are ``Literal`` types, checked when the config is built (``config.load``); ranges are checked in
``__post_init__``. Key names and defaults are verl's where the concept is the same; keys for machinery ColoRL
does not have are accepted with verl's defaults and checked in ``config.verl``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

from algos.registry import KL_LOSS_TYPES, LOSS_AGG_MODES, POLICY_LOSS_SPECS
from config.checks import (
    ConfigError,
    check,
    check_sampling,
    is_int,
    is_number,
    non_negative,
    optional_positive_int,
    positive,
    positive_int,
    unit_interval,
)

# verl's spellings too; fp16 would need loss scaling, which the updates do not do
ParamDtype = Literal["auto", "native", "bf16", "fp32", "bfloat16", "float32"]
ReduceDtype = Literal["fp32", "bf16", "float32", "bfloat16"]
LossAggMode = Literal[LOSS_AGG_MODES]  # type: ignore[valid-type]
PolicyLossMode = Literal[tuple(POLICY_LOSS_SPECS)]  # type: ignore[valid-type]
KLLossType = Literal[KL_LOSS_TYPES]  # type: ignore[valid-type]


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = None  # HF model dir; null -> the built-in tiny model
    enable_gradient_checkpointing: bool = True
    trust_remote_code: bool = False
    use_remove_padding: bool = True  # log-prob and update forwards on packed rows (no pad tokens computed)
    # log-probs, entropy and the exact KL from hidden states in chunks of tokens, logits recomputed in backward:
    # never the (tokens, vocabulary) logits (workers/compute/logprob.py); verl's key, whose default is false
    use_fused_kernels: bool = True
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank instead of the full model
    lora_alpha: float = 16
    target_modules: Any = "all-linear"  # "all-linear" or a list of module names
    use_shm: bool = False  # verl copies the model to shared memory first; ColoRL reads it where it is

    def __post_init__(self) -> None:
        check(self, ["lora_rank"], lambda v: is_int(v) and v >= 0, "must be 0 (full fine-tuning) or a positive rank")
        positive(self, "lora_alpha")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    lr_warmup_steps: int = -1  # -1 -> use lr_warmup_steps_ratio
    lr_warmup_steps_ratio: float = 0.0
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    lr_scheduler_type: Literal["constant"] = "constant"  # after the linear warm-up

    def __post_init__(self) -> None:
        positive(self, "lr")
        check(self, ["lr_warmup_steps"], lambda v: is_int(v) and v >= -1, "must be -1 (use the ratio) or >= 0")
        unit_interval(self, "lr_warmup_steps_ratio")
        non_negative(self, "weight_decay")
        check(
            self,
            ["betas"],
            lambda v: len(v) == 2 and all(is_number(b) and 0 <= b < 1 for b in v),
            "must be two numbers in [0, 1)",
        )


@dataclass(frozen=True)
class MixedPrecisionConfig:
    """Compute dtype of the sharded model; gradients reduce in reduce_dtype. auto = bf16 on CUDA, fp32 on CPU;
    native = bf16 where the device multiplies bf16 natively (CUDA, a CPU with AVX512-BF16 or AMX), else fp32."""

    param_dtype: ParamDtype = "auto"
    reduce_dtype: ReduceDtype = "fp32"


@dataclass(frozen=True)
class WrapPolicyConfig:
    """FSDP units: consecutive transformer blocks grouped into units of at least min_num_params parameters
    (0: a unit per block); blocks after the last full unit share the root's group. verl's key name; its FSDP1
    path wraps any submodule of that size instead."""

    min_num_params: int = 0

    def __post_init__(self) -> None:
        non_negative(self, "min_num_params")


@dataclass(frozen=True)
class FSDPConfig:
    param_offload: bool = False
    optimizer_offload: bool = False
    reshard_after_forward: bool = True
    fsdp_size: int = -1  # verl's hybrid-shard group size; ColoRL shards over all workers (-1)
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass(frozen=True)
class RefFSDPConfig:
    """A frozen role's FSDP settings: no optimizer to offload."""

    param_offload: bool = False
    reshard_after_forward: bool = True
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """verl's ``algorithm.rollout_correction``: importance weights and rejection between the rollout engine's
    policy and the trained one (``algos.rollout_correction``). Every switch needs the rollout's per-token
    log-probs (``rollout.calculate_log_probs``; ``config.plan`` checks). ColoRL's rollout is the pre-update policy
    itself, so its log-probs are the old ones whenever computed: bypass mode is the only mode."""

    rollout_is: Literal["token", "sequence"] | None = None  # importance weights per token or per sequence
    rollout_is_threshold: Any = 2.0  # truncate at it, or "lower_upper": zero weights outside (IcePop)
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None  # rejection options, comma-separated (e.g. "token_k1,seq_mean_k3")
    rollout_rs_threshold: Any = None
    bypass_mode: bool = False  # the rollout's log-probs are the old policy's (loss_mode bypass_mode)
    loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip"  # bypass mode's loss


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
    # bypass_mode reads these; verl copies algorithm.rollout_correction here when bypass mode is on
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
    ppo_mini_batch_size: int = 256  # prompts (global); × rollout.n / workers per rank (config.plan)
    ppo_micro_batch_size_per_gpu: int | None = None  # sequences per forward/backward on one worker
    use_dynamic_bsz: bool = False  # micro-batches by token budget instead of ppo_micro_batch_size_per_gpu
    ppo_max_token_len_per_gpu: int = 16384  # valid tokens per micro-batch with use_dynamic_bsz
    ppo_epochs: int = 1
    shuffle: bool = False
    clip_ratio: float = 0.2  # read only where clip_ratio_low/high are null
    clip_ratio_low: float | None = 0.2  # verl's default: 0.2 (not clip_ratio); null -> clip_ratio
    clip_ratio_high: float | None = 0.2
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages; DPPO's importance-weight truncation
    tau_pos: float = 1.0  # SAPO's gate temperature where the advantage is positive
    tau_neg: float = 1.05  # ... and where it is not
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: KLLossType = "low_var_kl"
    # one optimizer step per batch (ppo_epochs 1, one mini-batch) is on-policy: the update's own log-probs,
    # detached, are the old ones, so the separate old-log-prob forward is skipped (as TRL does)
    skip_on_policy_old_log_prob: bool = True
    # torch.compile the policy's forward (rollout, log-probs, update); pays off for small models on CPU after
    # a compile of about a minute, and recompiles when batch shapes change (docs/benchmarks.md)
    use_torch_compile: bool = False
    grad_clip: float = 1.0
    loss_agg_mode: LossAggMode = "token-mean"
    loss_scale_factor: float | None = None  # seq-mean-token-sum-norm's divisor; null -> the response length
    # with model.use_remove_padding, the rows of a micro-batch that repeat a prompt (a GRPO group) run it once, its
    # responses after it in one packed row: the same log-probs and gradients, less compute (workers.compute.packing)
    use_prefix_grouper: bool = False
    calculate_sum_pi_squared: bool = False  # return Σπ² with the old log-probs (on anyway when the estimator needs it)
    ulysses_sequence_parallel_size: int = 1  # verl's sequence parallelism; ColoRL runs whole sequences per rank
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)

    def __post_init__(self) -> None:
        positive_int(
            self, "ppo_mini_batch_size", "ppo_epochs", "ppo_max_token_len_per_gpu", "ulysses_sequence_parallel_size"
        )
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
                f"and clip_ratio_high={high} are set (verl's defaults are 0.2, not clip_ratio); set them, "
                "or null to follow clip_ratio",
                stacklevel=2,
            )


@dataclass(frozen=True)
class ValKwargs:
    """Sampling for validation: greedy, one response per prompt."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = False
    n: int = 1

    def __post_init__(self) -> None:
        check_sampling(self)
        positive_int(self, "n")


@dataclass(frozen=True)
class MultiTurnConfig:
    """Tool-calling rollouts (``workers.compute.agent_loop``): verl's ``rollout.multi_turn`` keys with verl's meaning.

    Rows whose ``agent_name`` (or ``rollout.agent.default_agent_loop``) is ``tool_agent`` generate assistant
    turns, call the tools of ``tool_config_path`` / ``function_tool_path`` (docs/tools.md) and continue until an
    answer without a call or a limit. null turn limits mean no limit (the response length still bounds a row).
    """

    enable: bool = False
    max_assistant_turns: int | None = None
    tool_config_path: str | None = None  # verl's tool YAML: tools: [{class_name, config, tool_schema}]
    function_tool_path: str | None = None  # a Python file of @function_tool functions
    max_user_turns: int | None = None  # tool-response turns count as user turns (verl)
    max_parallel_calls: int = 1  # calls run per assistant turn; later ones in the same turn are dropped
    max_tool_response_length: int = 256  # characters of one tool response; the rest is cut on truncate_side
    # which side is cut (verl 0.9): left keeps the end, right keeps the start, middle keeps both ends
    tool_response_truncate_side: Literal["left", "middle", "right"] = "middle"
    interaction_config_path: str | None = None  # verl's simulated user: refused (not in ColoRL)
    use_inference_chat_template: bool = False  # false: later turns see the recorded token ids (ColoRL always)
    # compare each row's training ids with the ids its turns were built from (token-exact: sampled, tool turns)
    tokenization_sanity_check_mode: Literal["strict", "ignore_strippable", "disable"] = "strict"
    format: Literal["hermes"] = "hermes"  # <tool_call>{"name": ..., "arguments": ...}</tool_call>
    num_repeat_rollouts: int | None = None  # verl's per-row repeats; ColoRL repeats prompts with rollout.n
    tool_timeout_s: float = 30.0  # ColoRL: a tool call (or create/release) running longer ends with an error

    def __post_init__(self) -> None:
        optional_positive_int(self, "max_assistant_turns", "max_user_turns")
        positive_int(self, "max_parallel_calls", "max_tool_response_length")
        positive(self, "tool_timeout_s")
        if self.interaction_config_path is not None:  # ignoring it would train without the simulated user
            raise ConfigError.invalid(
                "interaction_config_path",
                self.interaction_config_path,
                "verl's simulated-user interactions are not in ColoRL; set it to null",
            )


@dataclass(frozen=True)
class AgentLoopConfig:
    """verl's ``rollout.agent``: which loop a row without ``agent_name`` uses."""

    num_workers: int = 8  # verl's agent-loop processes; ColoRL runs the loop in each rollout worker
    default_agent_loop: Literal["single_turn_agent", "tool_agent"] = "single_turn_agent"
    agent_loop_config_path: str | None = None  # custom agent-loop classes: refused (not in ColoRL)

    def __post_init__(self) -> None:
        positive_int(self, "num_workers")
        if self.agent_loop_config_path is not None:
            raise ConfigError.invalid(
                "agent_loop_config_path",
                self.agent_loop_config_path,
                "custom agent loops are not in ColoRL (single_turn_agent and tool_agent are built in); set it to null",
            )


@dataclass(frozen=True)
class RolloutConfig:
    # ColoRL generates with the actor's own FSDP module; vllm/sglang are accepted with a warning (config.verl)
    name: Literal["hf", "vllm", "sglang"] = "hf"
    mode: Literal["sync", "async"] = "sync"
    n: int = 1  # responses per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    prompt_length: int = "${data.max_prompt_length}"  # type: ignore[assignment]
    response_length: int = "${data.max_response_length}"  # type: ignore[assignment]
    log_prob_micro_batch_size_per_gpu: int | None = None  # rows per old-log-prob forward on one worker
    log_prob_use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    log_prob_max_token_len_per_gpu: int = "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"  # type: ignore
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)
    # the rollout returns each sampled token's log-prob (rollout_log_probs; temperature-scaled, before top-k/top-p);
    # ColoRL's rollout is the pre-update policy itself, so they are the old log-probs and their forward is skipped
    calculate_log_probs: bool = False
    # vLLM/SGLang engine settings from verl command lines: accepted, meaningless for the HF rollout (config.verl)
    tensor_model_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    load_format: str = "dummy"
    layered_summon: bool = False
    max_model_len: int | None = None
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    enforce_eager: bool = False
    free_cache_engine: bool = True
    enable_chunked_prefill: bool = True
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)

    def __post_init__(self) -> None:
        check_sampling(self)
        positive_int(
            self,
            "n",
            "prompt_length",
            "response_length",
            "log_prob_max_token_len_per_gpu",
            "tensor_model_parallel_size",
        )
        optional_positive_int(self, "log_prob_micro_batch_size_per_gpu")


@dataclass(frozen=True)
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    log_prob_max_token_len_per_gpu: int = "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"  # type: ignore
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)

    def __post_init__(self) -> None:
        positive_int(self, "log_prob_max_token_len_per_gpu")
        optional_positive_int(self, "log_prob_micro_batch_size_per_gpu")


@dataclass(frozen=True)
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)

    def __post_init__(self) -> None:
        if self.actor.use_prefix_grouper is True and self.model.use_remove_padding is False:
            raise ConfigError.invalid(
                "actor.use_prefix_grouper",
                True,
                "shares prompts inside packed rows: needs actor_rollout_ref.model.use_remove_padding=true",
            )


@dataclass(frozen=True)
class CriticModelConfig:
    path: str | None = None  # null -> actor_rollout_ref.model.path
    enable_gradient_checkpointing: bool = True
    trust_remote_code: bool = "${actor_rollout_ref.model.trust_remote_code}"  # type: ignore[assignment]
    use_remove_padding: bool = False  # value and update forwards on packed rows


@dataclass(frozen=True)
class CriticConfig:
    enable: bool | None = None  # null -> used iff the advantage estimator needs values (gae)
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    ppo_mini_batch_size: int = "${actor_rollout_ref.actor.ppo_mini_batch_size}"  # type: ignore[assignment]
    ppo_micro_batch_size_per_gpu: int | None = None
    forward_micro_batch_size_per_gpu: int | None = "${critic.ppo_micro_batch_size_per_gpu}"  # type: ignore
    use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    ppo_max_token_len_per_gpu: int = 32768  # no vocabulary logits, so twice the actor's budget fits
    forward_max_token_len_per_gpu: int = "${critic.ppo_max_token_len_per_gpu}"  # type: ignore[assignment]
    ppo_epochs: int = "${actor_rollout_ref.actor.ppo_epochs}"  # type: ignore[assignment]
    shuffle: bool = "${actor_rollout_ref.actor.shuffle}"  # type: ignore[assignment]
    cliprange_value: float = 0.5
    grad_clip: float = 1.0
    loss_agg_mode: LossAggMode = "${actor_rollout_ref.actor.loss_agg_mode}"  # type: ignore[assignment]
    loss_scale_factor: float | None = "${actor_rollout_ref.actor.loss_scale_factor}"  # type: ignore[assignment]
    rollout_n: int = "${actor_rollout_ref.rollout.n}"  # type: ignore[assignment]
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)  # verl's critic.model.fsdp_config (an alias)

    def __post_init__(self) -> None:
        positive_int(
            self,
            "ppo_mini_batch_size",
            "ppo_epochs",
            "rollout_n",
            "ppo_max_token_len_per_gpu",
            "forward_max_token_len_per_gpu",
        )
        optional_positive_int(self, "ppo_micro_batch_size_per_gpu", "forward_micro_batch_size_per_gpu")
        positive(self, "cliprange_value", "grad_clip")


@dataclass(frozen=True)
class RewardModelPathConfig:
    path: str | None = None  # an HF sequence-classification checkpoint (one score per sequence)


@dataclass(frozen=True)
class RewardModelConfig:
    """A learned reward model, colocated with the other roles; its score is added to the rule-based reward.

    It reads the policy's token ids as they are, so it must share the policy's tokenizer (a different RM
    tokenizer is not supported yet).
    """

    enable: bool = False
    model: RewardModelPathConfig = field(default_factory=RewardModelPathConfig)
    micro_batch_size_per_gpu: int = 16
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)

    def __post_init__(self) -> None:
        positive_int(self, "micro_batch_size_per_gpu")
        if self.enable and not self.model.path:
            raise ConfigError.invalid(
                "model.path",
                self.model.path,
                "must name a sequence-classification checkpoint when reward_model.enable=true",
            )
