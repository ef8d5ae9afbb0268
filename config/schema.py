"""ColoRL's configuration schema: the root ``PPOConfig`` and the run-level components (data, algorithm, trainer).

One frozen dataclass per component is the single home of its defaults; the worker roles' components live in
``config.sections``. ``conf/*.yaml`` holds only presets on top of these defaults, and ``config.load`` builds the
typed, resolved config that travels to the driver and the workers. Choices are ``Literal`` types (checked when
the config is built), ranges are checked in each ``__post_init__``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from algos.registry import ESTIMATORS, KL_PENALTY_TYPES
from config.checks import (
    ConfigError,
    check,
    is_files,
    is_int,
    is_number,
    non_negative,
    optional_positive_int,
    positive,
    positive_int,
    unit_interval,
)
from config.distillation import DistillationConfig
from config.machinery import RayKwargsConfig, TrainerV1Tree
from config.sections import ActorRolloutRefConfig, CriticConfig, RewardConfig, RolloutCorrectionConfig

AdvEstimator = Literal[tuple(ESTIMATORS)]  # type: ignore[valid-type]
KLPenaltyType = Literal[KL_PENALTY_TYPES]  # type: ignore[valid-type]
LoggerBackend = Literal["console", "wandb", "file"]


@dataclass(frozen=True)
class DataConfig:
    train_files: Any = None  # str or list[str] of parquet/jsonl; null -> the built-in task's files
    val_files: Any = None
    train_max_samples: int = -1  # > 0: use only the first this many prompts of the files (-1: all)
    val_max_samples: int = -1
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    max_prompt_length: int = 512
    max_response_length: int = 512
    train_batch_size: int = 1024  # prompts per step
    # prompts per generation batch (null: train_batch_size); with algorithm.filter_groups, batches are drawn until
    # train_batch_size prompt groups have signal
    gen_batch_size: int | None = None
    val_batch_size: int | None = None  # null -> the whole validation set in one batch
    tool_config_path: str | None = "${actor_rollout_ref.rollout.multi_turn.tool_config_path}"  # type: ignore
    function_tool_path: str | None = "${actor_rollout_ref.rollout.multi_turn.function_tool_path}"  # type: ignore
    shuffle: bool = True
    seed: int | None = None  # the training order's seed; null -> trainer.seed
    filter_overlong_prompts: bool = False  # drop (and count) prompts longer than max_prompt_length
    # what happens to a longer prompt that is not filtered: error, or keep its last/first/both-ends tokens
    truncation: Literal["error", "left", "right", "middle"] = "error"
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. enable_thinking=false
    dataloader_drop_last: bool = True  # ColoRL: a last partial batch is dropped

    def __post_init__(self) -> None:
        positive_int(self, "train_batch_size", "max_prompt_length", "max_response_length")
        check(
            self,
            ["train_max_samples", "val_max_samples"],
            lambda v: is_int(v) and (v == -1 or v > 0),
            "must be -1 (all) or a positive number of prompts",
        )
        optional_positive_int(self, "val_batch_size", "gen_batch_size")
        check(self, ["train_files", "val_files"], is_files, "must be null, a path or a list of paths")


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class KLCtrlConfig:
    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: float = 0.001
    target_kl: float = 0.1  # adaptive only
    horizon: int = 10000  # adaptive only

    def __post_init__(self) -> None:
        non_negative(self, "kl_coef")
        positive(self, "target_kl")
        positive_int(self, "horizon")


# metrics computed from the batch's tensors; any other name is a value the reward function returns per response
# ("acc" falls back to the score when the function returns a plain number, as the dapo reward manager records)
FILTER_TENSOR_METRICS = ("reward", "seq_reward", "seq_final_reward")


@dataclass(frozen=True)
class FilterGroupsConfig:
    """``algorithm.filter_groups``: DAPO's dynamic sampling, keeping only prompt groups whose ``metric`` differs
    between their responses.

    A group whose responses all score the same gives GRPO-style estimators zero advantage: it trains nothing.
    With ``enable``, generation repeats in batches of ``data.gen_batch_size`` prompts until
    ``data.train_batch_size`` groups with signal are collected, at most ``max_num_gen_batches`` batches a step
    (0: no limit), and the step trains on exactly ``data.train_batch_size`` of them (the surplus is dropped).
    ``metric``: ``reward``/``seq_reward`` (a response's summed score), ``seq_final_reward`` (its summed reward
    after the in-reward KL), or a value the reward function returns (``acc``, ``score``, ...).
    """

    enable: bool = False
    metric: str = "reward"
    max_num_gen_batches: int = 0

    def __post_init__(self) -> None:
        check(self, ["metric"], lambda v: isinstance(v, str) and v != "", "must name a metric (acc, score, ...)")
        check(self, ["max_num_gen_batches"], is_int, "must be an integer (0 or less: no limit)")


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_estimator: AdvEstimator = "gae"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: KLPenaltyType = "kl"
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    gdpo_reward_keys: list[str] | None = None  # gdpo: the compute_score dict's entries normalised one by one
    gdpo_reward_weights: list[float] | None = None  # gdpo: their weights (null: 1 each)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)  # DAPO's dynamic sampling
    # what a rejected choice probably meant (shown with the error): the in-reward KL sees token log-probs only
    choice_hints: ClassVar[dict[str, str]] = {"kl_penalty": "'full' is for actor_rollout_ref.actor.kl_loss_type"}

    def __post_init__(self) -> None:
        unit_interval(self, "gamma", "lam")
        keys, weights = self.gdpo_reward_keys, self.gdpo_reward_weights
        if self.adv_estimator == "gdpo" and not keys:
            raise ConfigError.invalid(
                "gdpo_reward_keys",
                keys,
                "gdpo normalises each reward component on its own: "
                "list the keys of the dict your compute_score returns, e.g. [format, accuracy]",
            )
        if keys and weights is not None and len(weights) != len(keys):
            raise ConfigError.invalid("gdpo_reward_weights", weights, f"needs one weight per key of {keys}")


@dataclass(frozen=True)
class HealthConfig:
    """When the run's health warnings fire (``trainer.health``): a pattern must hold ``patience`` steps in a row
    (the reward-against-held-out one ``divergence_validations`` validations in a row); each warns once. The
    entropy, length-limit and all-equal-groups patterns count only while the training score has stalled: it has
    not risen over the last ``stall_window`` steps and stays below ``converged_share`` of the way from the lowest
    to the highest response score of those steps (a run that learns, or has converged, is healthy)."""

    patience: int = 10
    entropy_collapse_ratio: float = 0.1  # actor/entropy below this share of its first value
    max_clip_ratio: float = 0.5  # share of responses cut at data.max_response_length
    max_all_equal_share: float = 0.9  # share of prompt groups whose responses all got the same reward
    divergence_validations: int = 2  # the training score rose and a held-out score fell, validation after validation
    stall_window: int = 100  # steps over which a training score that does not rise significantly has stalled
    converged_share: float = 0.8  # a score this far up its window's response range has converged, not stalled
    # mean |π_rollout − π_actor| of the sampled tokens (training/rollout_probs_diff_mean) above which it warns at once
    max_rollout_probs_diff: float = 0.05

    def __post_init__(self) -> None:
        positive_int(self, "patience", "divergence_validations")
        check(self, ["stall_window"], lambda v: is_int(v) and v >= 3, "must be an integer of at least 3 steps")
        unit_interval(
            self,
            "entropy_collapse_ratio",
            "max_clip_ratio",
            "max_all_equal_share",
            "converged_share",
            "max_rollout_probs_diff",
        )


@dataclass(frozen=True)
class ReportConfig:
    """The run report (``trainer.report``): ``<default_local_dir>/report.html``, written at each validation and at
    the end, and the sampled trajectories it shows (``<default_local_dir>/samples/``,
    ``trainer.observing.generations``)."""

    enable: bool = True
    samples_per_step: int = 8  # responses kept per step and per validation for the trajectory browser

    def __post_init__(self) -> None:
        check(self, ["samples_per_step"], lambda v: is_int(v) and v >= 0, "must be a non-negative integer")


@dataclass(frozen=True)
class TrainerConfig:
    # reorder each step's rows so every worker gets a similar number of tokens (trainer.running.balance)
    balance_batch: bool = True
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto -> cuda when visible, else cpu
    n_gpus_per_node: int = 8  # worker processes per node (also on CPU)
    nnodes: int = 1
    total_epochs: int = 30
    total_training_steps: int | None = None  # null -> total_epochs × batches per epoch
    logger: list[LoggerBackend] = field(default_factory=lambda: ["console", "wandb"])  # a single name is a list of it
    project_name: str = "verl_examples"
    experiment_name: str = "gsm8k"
    log_val_generations: int = 0  # validation samples printed (console) and logged as wandb's val/generations table
    # generation dumps: one JSONL file per step (trainer.observing.generations); null: none
    rollout_data_dir: str | None = None  # every training response of each step: <dir>/<step>.jsonl
    validation_data_dir: str | None = None  # every validation response: <dir>/<step>.jsonl
    # > 0: validate (save) every this many steps and at the last step; <= 0: never; ColoRL still
    # saves when stopped by SIGTERM/SIGINT or trainer.max_wall_time_s, to resume from
    test_freq: int = -1
    save_freq: int = -1
    val_before_train: bool = True
    val_only: bool = False  # validate (before training) and stop
    v1: TrainerV1Tree = field(default_factory=TrainerV1Tree.default)
    critic_warmup: int = 0  # the actor is updated from step critic_warmup on; the critic from the first step
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    seed: int = 1
    deterministic: bool = False  # deterministic kernels + RNG restored on resume: bitwise-repeatable runs on CPU
    # the workers as Ray actors (true), or one worker in the driver's process without Ray (false: breakpoint() in
    # worker code stops in the terminal; one worker, sync mode); null: Ray when installed (docs/debugging.md)
    use_ray: bool | None = None
    max_wall_time_s: float | None = None  # stop cleanly after this many seconds
    # auto: latest complete checkpoint in default_local_dir | disable | resume_path
    resume_mode: Literal["auto", "disable", "resume_path"] = "auto"
    resume_from_path: str | None = None  # a global_step_N directory (resume_mode=resume_path)
    # keys (or prefixes) that may differ from the config a resumed checkpoint was saved with (trainer.state.fingerprint)
    resume_accept_changes: list[str] = field(default_factory=list)
    max_actor_ckpt_to_keep: int | None = None  # null keeps every checkpoint
    max_critic_ckpt_to_keep: int | None = None
    max_nonfinite_steps: int = 5  # abort after this many steps in a row whose loss/gradients were NaN/inf
    phase_timeout_s: float | None = 1800.0  # a phase running longer is a hang: dump stacks, exit 3; null: off
    # after the first SIGTERM/SIGINT the run has exited within this many seconds: the step in progress and its
    # checkpoint if they fit, else that step abandoned (previous checkpoint kept). 25: 5 s inside the 30 s a scheduler
    # gives before SIGKILL (Slurm's KillWait, Kubernetes' terminationGracePeriodSeconds); null: wait for the step
    stop_grace_s: float | None = 25.0
    max_restarts: int = 0  # times a dead worker's group is rebuilt and resumed from the last checkpoint
    dry_run: bool = False  # print a step's batch arithmetic and the memory estimate per worker, then exit
    check_memory: bool = True  # refuse to start when the estimated peak memory per worker exceeds the device's
    health: HealthConfig = field(default_factory=HealthConfig)
    report: ReportConfig = field(default_factory=ReportConfig)

    def __post_init__(self) -> None:
        positive_int(self, "n_gpus_per_node", "nnodes", "total_epochs")
        check(self, ["log_val_generations"], lambda v: is_int(v) and v >= 0, "must be a non-negative integer")
        check(self, ["critic_warmup"], lambda v: is_int(v) and v >= 0, "must be a non-negative integer")
        optional_positive_int(self, "total_training_steps")
        check(self, ["max_wall_time_s"], lambda v: v is None or (is_number(v) and v > 0), "must be null or > 0")
        check(
            self,
            ["phase_timeout_s"],
            lambda v: v is None or (is_number(v) and v > 0),
            "must be null (no watchdog) or > 0 seconds",
        )
        check(
            self,
            ["stop_grace_s"],
            lambda v: v is None or (is_number(v) and v > 0),
            "must be null (wait for the step) or > 0 seconds",
        )
        check(self, ["max_restarts"], lambda v: is_int(v) and v >= 0, "must be a non-negative integer")
        optional_positive_int(self, "max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep")
        positive_int(self, "max_nonfinite_steps")
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            raise ConfigError.invalid(
                "resume_from_path",
                self.resume_from_path,
                "must name a checkpoint directory when resume_mode=resume_path",
            )


@dataclass(frozen=True)
class PPOConfig:
    data: DataConfig = field(default_factory=DataConfig)
    builtin: BuiltinConfig = field(default_factory=BuiltinConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    distillation: DistillationConfig = field(default_factory=DistillationConfig)  # on-policy distillation
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)

    def __post_init__(self) -> None:
        if self.data.apply_chat_template_kwargs and self.actor_rollout_ref.rollout.multi_turn.enable:
            raise ConfigError.invalid(
                "data.apply_chat_template_kwargs",
                self.data.apply_chat_template_kwargs,
                "applies to single-turn prompts only in ColoRL; the multi-turn agent loop renders the template as is",
            )
        kwargs = self.reward.reward_kwargs
        max_resp_len = kwargs.max_resp_len or self.data.max_response_length
        if kwargs.overlong_buffer_cfg.enable and kwargs.overlong_buffer_cfg.len > max_resp_len:
            raise ConfigError.invalid(
                "reward.reward_kwargs.overlong_buffer_cfg.len",
                kwargs.overlong_buffer_cfg.len,
                f"must not exceed max_resp_len={max_resp_len} (reward.reward_kwargs.max_resp_len, null: "
                "data.max_response_length)",
            )
