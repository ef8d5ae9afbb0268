"""ColoRL's configuration schema: one dataclass per component, the single home of every default.

Hydra composes ``conf/ppo_trainer.yaml`` on top of these dataclasses (registered as ``ppo_config_schema``), so
the YAML holds only presets, and command-line overrides are type-checked against the schema. Each dataclass
checks its own values in ``__post_init__``; loading and the cross-field checks live in ``trainer.config``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore

from trainer.config_checks import (
    ConfigError,
    is_files,
    is_int,
    is_number,
    check,
    positive_int,
    optional_positive_int,
    positive,
    non_negative,
    unit_interval,
    one_of,
    check_sampling,
)
from trainer.core_algos import (
    ADV_ESTIMATORS,
    KL_LOSS_TYPES,
    KL_PENALTY_TYPES,
    LOSS_AGG_MODES,
    POLICY_LOSS_MODES,
    validate_adv_estimator,
)

KL_CTRL_TYPES = ("fixed", "adaptive")
RESUME_MODES = ("auto", "disable", "resume_path")
DEVICES = ("auto", "cpu", "cuda")
LOGGER_BACKENDS = ("console", "wandb", "file")
# verl's spellings too; fp16 would need loss scaling, which the updates do not do
PARAM_DTYPES = ("auto", "bf16", "fp32", "bfloat16", "float32")
REDUCE_DTYPES = ("fp32", "bf16", "float32", "bfloat16")


@dataclass
class DataConfig:
    train_files: Any = None  # str or list[str] of parquet/jsonl; null -> the built-in task's files
    val_files: Any = None
    train_batch_size: int = 16  # prompts per step
    val_batch_size: Optional[int] = None  # null -> the whole validation set in one batch
    max_prompt_length: int = 16
    max_response_length: int = 8
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    filter_overlong_prompts: bool = True
    shuffle: bool = True
    seed: int = 1
    dataloader_drop_last: bool = True

    def __post_init__(self) -> None:
        positive_int(self, "train_batch_size", "max_prompt_length", "max_response_length")
        optional_positive_int(self, "val_batch_size")
        check(self, ["train_files", "val_files"], is_files, "must be null, a path or a list of paths")


@dataclass
class BuiltinConfig:
    """The offline demo task, used when data.train_files / actor_rollout_ref.model.path are null."""

    task: str = "copy"
    num_train: int = 2000
    num_val: int = 128
    cache_dir: str = ".cache/colorl"  # tokenizer + tiny model + parquet, written once
    sft_warmup_steps: int = 15  # supervised warm-up before RL teaches the answer format; 0 disables
    hidden_size: int = 128
    num_layers: int = 2

    def __post_init__(self) -> None:
        positive_int(self, "num_train", "num_val", "hidden_size", "num_layers")
        check(self, ["sft_warmup_steps"], lambda v: is_int(v) and v >= 0, "must be a non-negative integer")


@dataclass
class ModelConfig:
    path: Optional[str] = None  # HF model dir; null -> the built-in tiny model
    enable_gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    use_remove_padding: bool = False  # log-prob and update forwards on packed rows (no pad tokens computed)


@dataclass
class OptimConfig:
    lr: float = 1e-3
    lr_warmup_steps: int = -1  # -1 -> use lr_warmup_steps_ratio
    lr_warmup_steps_ratio: float = 0.0
    weight_decay: float = 0.0
    betas: List[float] = field(default_factory=lambda: [0.9, 0.99])

    def __post_init__(self) -> None:
        positive(self, "lr")
        check(self, ["lr_warmup_steps"], lambda v: is_int(v) and v >= -1, "must be -1 (use the ratio) or >= 0")
        unit_interval(self, "lr_warmup_steps_ratio")
        non_negative(self, "weight_decay")
        check(self, ["betas"], lambda v: len(v) == 2 and all(is_number(b) and 0 <= b < 1 for b in v),
               "must be two numbers in [0, 1)")


@dataclass
class MixedPrecisionConfig:
    """Compute dtype of the sharded model: auto = bf16 on CUDA, fp32 on CPU; gradients reduce in reduce_dtype."""

    param_dtype: str = "auto"
    reduce_dtype: str = "fp32"

    def __post_init__(self) -> None:
        one_of(self, "param_dtype", PARAM_DTYPES)
        one_of(self, "reduce_dtype", REDUCE_DTYPES)


@dataclass
class WrapPolicyConfig:
    """FSDP units: consecutive transformer blocks grouped into units of at least min_num_params parameters
    (0: a unit per block); blocks after the last full unit share the root's group. verl's key name; its FSDP1
    path wraps any submodule of that size instead."""

    min_num_params: int = 0

    def __post_init__(self) -> None:
        non_negative(self, "min_num_params")


@dataclass
class FSDPConfig:
    param_offload: bool = False
    optimizer_offload: bool = False
    reshard_after_forward: bool = True
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass
class RefFSDPConfig:
    param_offload: bool = False
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"  # vanilla: token-level dual-clip PPO | gspo: sequence-level ratio (GSPO)

    def __post_init__(self) -> None:
        one_of(self, "loss_mode", POLICY_LOSS_MODES)


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_mini_batch_size: int = 16  # prompts (global); the worker multiplies by rollout.n, divides by world size
    ppo_micro_batch_size_per_gpu: int = 64  # sequences per forward/backward on one worker
    use_dynamic_bsz: bool = False  # micro-batches by token budget instead of ppo_micro_batch_size_per_gpu
    ppo_max_token_len_per_gpu: int = 16384  # valid tokens per micro-batch with use_dynamic_bsz
    ppo_epochs: int = 1
    shuffle: bool = False
    clip_ratio: float = 0.2
    clip_ratio_low: Optional[float] = None  # null -> clip_ratio
    clip_ratio_high: Optional[float] = None
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    # one optimizer step per batch (ppo_epochs 1, one mini-batch) is on-policy: the update's own log-probs,
    # detached, are the old ones, so the separate old-log-prob forward is skipped (as TRL does)
    skip_on_policy_old_log_prob: bool = True
    # torch.compile the policy's forward (rollout, log-probs, update): ~1.3x faster one-worker steps for small
    # models on CPU after about a minute of compiling (recompiles when batch shapes change); off by default
    use_torch_compile: bool = False
    grad_clip: float = 1.0
    loss_agg_mode: str = "token-mean"
    policy_loss: PolicyLossConfig = field(default_factory=lambda: PolicyLossConfig())
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)

    def __post_init__(self) -> None:
        positive_int(self, "ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "ppo_epochs",
                      "ppo_max_token_len_per_gpu")
        positive(self, "clip_ratio", "grad_clip")
        check(self, ["clip_ratio_low", "clip_ratio_high"], lambda v: v is None or (is_number(v) and v > 0),
               "must be null (use clip_ratio) or > 0")
        check(self, ["clip_ratio_c"], lambda v: is_number(v) and v > 1, "must be > 1")
        non_negative(self, "kl_loss_coef")
        one_of(self, "kl_loss_type", KL_LOSS_TYPES)
        one_of(self, "loss_agg_mode", LOSS_AGG_MODES)


@dataclass
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


@dataclass
class RolloutConfig:
    n: int = 8  # responses per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    prompt_length: int = "${data.max_prompt_length}"  # type: ignore[assignment]
    response_length: int = "${data.max_response_length}"  # type: ignore[assignment]
    log_prob_micro_batch_size_per_gpu: int = 128
    # relative (".." = actor_rollout_ref), so the sub-tree a worker gets resolves without the root
    log_prob_use_dynamic_bsz: bool = "${..actor.use_dynamic_bsz}"  # type: ignore[assignment]
    log_prob_max_token_len_per_gpu: int = "${..actor.ppo_max_token_len_per_gpu}"  # type: ignore[assignment]
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)

    def __post_init__(self) -> None:
        check_sampling(self)
        positive_int(self, "n", "prompt_length", "response_length", "log_prob_micro_batch_size_per_gpu",
                      "log_prob_max_token_len_per_gpu")


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = 128
    log_prob_use_dynamic_bsz: bool = "${..actor.use_dynamic_bsz}"  # type: ignore[assignment]
    log_prob_max_token_len_per_gpu: int = "${..actor.ppo_max_token_len_per_gpu}"  # type: ignore[assignment]
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)

    def __post_init__(self) -> None:
        positive_int(self, "log_prob_micro_batch_size_per_gpu", "log_prob_max_token_len_per_gpu")


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)


@dataclass
class CriticModelConfig:
    path: Optional[str] = None  # null -> actor_rollout_ref.model.path
    enable_gradient_checkpointing: bool = False
    use_remove_padding: bool = False  # value and update forwards on packed rows


@dataclass
class CriticConfig:
    enable: Optional[bool] = None  # null -> used iff the advantage estimator needs values (gae)
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_mini_batch_size: int = "${actor_rollout_ref.actor.ppo_mini_batch_size}"  # type: ignore[assignment]
    ppo_micro_batch_size_per_gpu: int = 64
    forward_micro_batch_size_per_gpu: int = 128
    use_dynamic_bsz: bool = False  # micro-batches by token budget (the two *_max_token_len_per_gpu below)
    ppo_max_token_len_per_gpu: int = 32768  # no vocabulary logits, so twice the actor's budget fits
    forward_max_token_len_per_gpu: int = "${.ppo_max_token_len_per_gpu}"  # type: ignore[assignment]
    ppo_epochs: int = 1
    shuffle: bool = False
    cliprange_value: float = 0.5
    grad_clip: float = 1.0
    loss_agg_mode: str = "token-mean"
    rollout_n: int = "${actor_rollout_ref.rollout.n}"  # type: ignore[assignment]
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)

    def __post_init__(self) -> None:
        positive_int(self, "ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu",
                      "forward_micro_batch_size_per_gpu", "ppo_epochs", "rollout_n",
                      "ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu")
        positive(self, "cliprange_value", "grad_clip")
        one_of(self, "loss_agg_mode", LOSS_AGG_MODES)


@dataclass
class RewardModelPathConfig:
    path: Optional[str] = None  # an HF sequence-classification checkpoint (one score per sequence)


@dataclass
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
            raise ConfigError.invalid("model.path", self.model.path,
                                      "must name a sequence-classification checkpoint when reward_model.enable=true")


@dataclass
class KLCtrlConfig:
    type: str = "fixed"
    kl_coef: float = 0.001
    target_kl: float = 0.1  # adaptive only
    horizon: int = 10000  # adaptive only

    def __post_init__(self) -> None:
        one_of(self, "type", KL_CTRL_TYPES)
        non_negative(self, "kl_coef")
        positive(self, "target_kl")
        positive_int(self, "horizon")


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)

    def __post_init__(self) -> None:
        try:
            validate_adv_estimator(self.adv_estimator)
        except ValueError:
            raise ConfigError.invalid("adv_estimator", self.adv_estimator,
                                      f"must be one of {', '.join(ADV_ESTIMATORS)}") from None
        unit_interval(self, "gamma", "lam")
        if self.kl_penalty == "full":  # the in-reward KL sees token log-probs only
            raise ConfigError.invalid("kl_penalty", "full", f"must be one of {', '.join(KL_PENALTY_TYPES)} "
                                      "('full' is for actor_rollout_ref.actor.kl_loss_type)")
        one_of(self, "kl_penalty", KL_PENALTY_TYPES)


@dataclass
class TrainerConfig:
    device: str = "auto"  # auto -> cuda when visible, else cpu
    n_gpus_per_node: int = 2  # worker processes per node (also on CPU)
    nnodes: int = 1
    total_epochs: int = 1000
    total_training_steps: Optional[int] = None  # null -> total_epochs × batches per epoch
    logger: List[str] = field(default_factory=lambda: ["console", "file"])
    project_name: str = "colorl"
    experiment_name: str = "copy_demo"
    test_freq: int = 10  # <= 0 disables periodic validation
    save_freq: int = 20  # <= 0 disables periodic checkpoints (a run still saves at its end and on SIGTERM/SIGINT)
    val_before_train: bool = True
    default_local_dir: str = "outputs/${trainer.project_name}/${trainer.experiment_name}"
    seed: int = 1
    deterministic: bool = False  # deterministic kernels + RNG restored on resume: bitwise-repeatable runs on CPU
    max_wall_time_s: Optional[float] = None  # stop cleanly after this many seconds
    resume_mode: str = "auto"  # auto: latest complete checkpoint in default_local_dir | disable | resume_path
    resume_from_path: Optional[str] = None  # a global_step_N directory (resume_mode=resume_path)
    max_actor_ckpt_to_keep: Optional[int] = None  # null keeps every checkpoint
    max_critic_ckpt_to_keep: Optional[int] = None
    max_nonfinite_steps: int = 5  # abort after this many steps in a row whose loss/gradients were NaN/inf
    phase_timeout_s: Optional[float] = 1800.0  # a phase running longer is a hang: dump stacks, exit 3; null: off
    max_restarts: int = 0  # times a dead worker's group is rebuilt and resumed from the last checkpoint

    def __post_init__(self) -> None:
        one_of(self, "device", DEVICES)
        positive_int(self, "n_gpus_per_node", "nnodes", "total_epochs")
        optional_positive_int(self, "total_training_steps")
        check(self, ["logger"], lambda v: all(b in LOGGER_BACKENDS for b in v),
               f"backends must be among {', '.join(LOGGER_BACKENDS)}")
        check(self, ["max_wall_time_s"], lambda v: v is None or (is_number(v) and v > 0), "must be null or > 0")
        check(self, ["phase_timeout_s"], lambda v: v is None or (is_number(v) and v > 0),
               "must be null (no watchdog) or > 0 seconds")
        check(self, ["max_restarts"], lambda v: is_int(v) and v >= 0, "must be a non-negative integer")
        one_of(self, "resume_mode", RESUME_MODES)
        optional_positive_int(self, "max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep")
        positive_int(self, "max_nonfinite_steps")
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            raise ConfigError.invalid("resume_from_path", self.resume_from_path,
                                      "must name a checkpoint directory when resume_mode=resume_path")


@dataclass
class RayInitConfig:
    address: Optional[str] = None  # null -> start a local cluster (or join RAY_ADDRESS when set)
    num_cpus: Optional[int] = None  # null -> n_workers + 1 on CPU, Ray's own count on GPU

    def __post_init__(self) -> None:
        optional_positive_int(self, "num_cpus")


@dataclass
class CustomRewardFunctionConfig:
    """A user's ``compute_score(data_source, solution_str, ground_truth, extra_info)`` in a Python file.

    A null path keeps the built-in rule-based rewards, picked by each row's data source.
    """

    path: Optional[str] = None
    name: str = "compute_score"

    def __post_init__(self) -> None:
        check(self, ["path"], lambda v: v is None or (isinstance(v, str) and v.strip() != ""),
               "must be null (built-in rewards) or the path of a Python file")
        check(self, ["name"], lambda v: isinstance(v, str) and v.isidentifier(), "must be a Python function name")


@dataclass
class PPOConfig:
    data: DataConfig = field(default_factory=DataConfig)
    builtin: BuiltinConfig = field(default_factory=BuiltinConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)


ConfigStore.instance().store(name="ppo_config_schema", node=PPOConfig)
