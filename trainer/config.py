"""ColoRL's configuration: one dataclass per component, the single home of every default.

Hydra composes ``conf/ppo_trainer.yaml`` on top of these dataclasses (registered as ``ppo_config_schema``), so
the YAML holds only presets, and command-line overrides are type-checked against the schema. Each dataclass
checks its own values in ``__post_init__``; ``validate_config`` adds the cross-field batch arithmetic that must
hold before Ray starts. Every problem is a ``ConfigError`` whose message names the full key, the value and what
is valid, e.g. ``data.train_batch_size=0: must be a positive integer``.
"""

from __future__ import annotations

import typing
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, List, Optional, Union

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError
import torch

from trainer.core_algos import (
    ADV_ESTIMATORS,
    KL_LOSS_TYPES,
    KL_PENALTY_TYPES,
    LOSS_AGG_MODES,
    POLICY_LOSS_MODES,
    estimator_needs_critic,
    validate_adv_estimator,
)

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
KL_CTRL_TYPES = ("fixed", "adaptive")
RESUME_MODES = ("auto", "disable", "resume_path")
DEVICES = ("auto", "cpu", "cuda")
LOGGER_BACKENDS = ("console", "wandb", "file")


class ConfigError(ValueError):
    """An invalid configuration; the message alone tells the user what to change."""

    def __init__(self, message: str, *, key: str | None = None, value: Any = None, reason: str = "") -> None:
        super().__init__(message)
        self.key, self.value, self.reason = key, value, reason

    @classmethod
    def invalid(cls, key: str, value: Any, reason: str) -> ConfigError:
        """``key=value: reason``, keeping the parts so a parent can prefix the key (see ``under``)."""
        return cls(f"{key}={_show(value)}: {reason}", key=key, value=value, reason=reason)

    def under(self, prefix: str) -> ConfigError:
        """The same error with ``prefix.`` in front of its key (a component only knows its own keys)."""
        return self if self.key is None else ConfigError.invalid(f"{prefix}.{self.key}", self.value, self.reason)


def _show(value: Any) -> str:
    if value is None:
        return "null"
    return repr(value) if isinstance(value, str) else str(value)


# ------------------------------------------------------------------------------------- per-field checks


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_files(v: Any) -> bool:
    return v is None or isinstance(v, str) or (isinstance(v, list) and all(isinstance(f, str) for f in v))


def _check(obj: Any, names: Sequence[str], ok: Callable[[Any], bool], reason: str) -> None:
    for name in names:
        value = getattr(obj, name)
        # "${...}" defaults are checked once resolved, when the whole tree is built (to_dataclass)
        if not (isinstance(value, str) and "${" in value) and not ok(value):
            raise ConfigError.invalid(name, value, reason)


def _positive_int(obj: Any, *names: str) -> None:
    _check(obj, names, lambda v: _is_int(v) and v > 0, "must be a positive integer")


def _optional_positive_int(obj: Any, *names: str) -> None:
    _check(obj, names, lambda v: v is None or (_is_int(v) and v > 0), "must be null or a positive integer")


def _positive(obj: Any, *names: str) -> None:
    _check(obj, names, lambda v: _is_number(v) and v > 0, "must be > 0")


def _non_negative(obj: Any, *names: str) -> None:
    _check(obj, names, lambda v: _is_number(v) and v >= 0, "must be >= 0")


def _unit_interval(obj: Any, *names: str) -> None:
    _check(obj, names, lambda v: _is_number(v) and 0 <= v <= 1, "must be in [0, 1]")


def _one_of(obj: Any, name: str, choices: Sequence[str]) -> None:
    _check(obj, [name], lambda v: v in choices, f"must be one of {', '.join(choices)}")


def _check_sampling(obj: Any) -> None:
    _non_negative(obj, "temperature")
    _check(obj, ["top_p"], lambda v: _is_number(v) and 0 < v <= 1, "must be in (0, 1]")
    _check(obj, ["top_k"], lambda v: _is_int(v) and (v == -1 or v > 0), "must be -1 (off) or a positive integer")


# ------------------------------------------------------------------------------------------- components


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
        _positive_int(self, "train_batch_size", "max_prompt_length", "max_response_length")
        _optional_positive_int(self, "val_batch_size")
        _check(self, ["train_files", "val_files"], _is_files, "must be null, a path or a list of paths")


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
        _positive_int(self, "num_train", "num_val", "hidden_size", "num_layers")
        _check(self, ["sft_warmup_steps"], lambda v: _is_int(v) and v >= 0, "must be a non-negative integer")


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
        _positive(self, "lr")
        _check(self, ["lr_warmup_steps"], lambda v: _is_int(v) and v >= -1, "must be -1 (use the ratio) or >= 0")
        _unit_interval(self, "lr_warmup_steps_ratio")
        _non_negative(self, "weight_decay")
        _check(self, ["betas"], lambda v: len(v) == 2 and all(_is_number(b) and 0 <= b < 1 for b in v),
               "must be two numbers in [0, 1)")


@dataclass
class FSDPConfig:
    param_offload: bool = False
    optimizer_offload: bool = False
    reshard_after_forward: bool = True


@dataclass
class RefFSDPConfig:
    param_offload: bool = False


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"  # vanilla: token-level dual-clip PPO | gspo: sequence-level ratio (GSPO)

    def __post_init__(self) -> None:
        _one_of(self, "loss_mode", POLICY_LOSS_MODES)


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
    grad_clip: float = 1.0
    loss_agg_mode: str = "token-mean"
    policy_loss: PolicyLossConfig = field(default_factory=lambda: PolicyLossConfig())
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)

    def __post_init__(self) -> None:
        _positive_int(self, "ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "ppo_epochs",
                      "ppo_max_token_len_per_gpu")
        _positive(self, "clip_ratio", "grad_clip")
        _check(self, ["clip_ratio_low", "clip_ratio_high"], lambda v: v is None or (_is_number(v) and v > 0),
               "must be null (use clip_ratio) or > 0")
        _check(self, ["clip_ratio_c"], lambda v: _is_number(v) and v > 1, "must be > 1")
        _non_negative(self, "kl_loss_coef")
        _one_of(self, "kl_loss_type", KL_LOSS_TYPES)
        _one_of(self, "loss_agg_mode", LOSS_AGG_MODES)


@dataclass
class ValKwargs:
    """Sampling for validation: greedy, one response per prompt."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = False
    n: int = 1

    def __post_init__(self) -> None:
        _check_sampling(self)
        _positive_int(self, "n")


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
        _check_sampling(self)
        _positive_int(self, "n", "prompt_length", "response_length", "log_prob_micro_batch_size_per_gpu",
                      "log_prob_max_token_len_per_gpu")


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = 128
    log_prob_use_dynamic_bsz: bool = "${..actor.use_dynamic_bsz}"  # type: ignore[assignment]
    log_prob_max_token_len_per_gpu: int = "${..actor.ppo_max_token_len_per_gpu}"  # type: ignore[assignment]
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)

    def __post_init__(self) -> None:
        _positive_int(self, "log_prob_micro_batch_size_per_gpu", "log_prob_max_token_len_per_gpu")


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
        _positive_int(self, "ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu",
                      "forward_micro_batch_size_per_gpu", "ppo_epochs", "rollout_n",
                      "ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu")
        _positive(self, "cliprange_value", "grad_clip")
        _one_of(self, "loss_agg_mode", LOSS_AGG_MODES)


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
        _positive_int(self, "micro_batch_size_per_gpu")
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
        _one_of(self, "type", KL_CTRL_TYPES)
        _non_negative(self, "kl_coef")
        _positive(self, "target_kl")
        _positive_int(self, "horizon")


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
        _unit_interval(self, "gamma", "lam")
        if self.kl_penalty == "full":  # the in-reward KL sees token log-probs only
            raise ConfigError.invalid("kl_penalty", "full", f"must be one of {', '.join(KL_PENALTY_TYPES)} "
                                      "('full' is for actor_rollout_ref.actor.kl_loss_type)")
        _one_of(self, "kl_penalty", KL_PENALTY_TYPES)


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
    save_freq: int = -1  # <= 0 disables periodic checkpoints
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
        _one_of(self, "device", DEVICES)
        _positive_int(self, "n_gpus_per_node", "nnodes", "total_epochs")
        _optional_positive_int(self, "total_training_steps")
        _check(self, ["logger"], lambda v: all(b in LOGGER_BACKENDS for b in v),
               f"backends must be among {', '.join(LOGGER_BACKENDS)}")
        _check(self, ["max_wall_time_s"], lambda v: v is None or (_is_number(v) and v > 0), "must be null or > 0")
        _check(self, ["phase_timeout_s"], lambda v: v is None or (_is_number(v) and v > 0),
               "must be null (no watchdog) or > 0 seconds")
        _check(self, ["max_restarts"], lambda v: _is_int(v) and v >= 0, "must be a non-negative integer")
        _one_of(self, "resume_mode", RESUME_MODES)
        _optional_positive_int(self, "max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep")
        _positive_int(self, "max_nonfinite_steps")
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            raise ConfigError.invalid("resume_from_path", self.resume_from_path,
                                      "must name a checkpoint directory when resume_mode=resume_path")


@dataclass
class RayInitConfig:
    address: Optional[str] = None  # null -> start a local cluster (or join RAY_ADDRESS when set)
    num_cpus: Optional[int] = None  # null -> n_workers + 1 on CPU, Ray's own count on GPU

    def __post_init__(self) -> None:
        _optional_positive_int(self, "num_cpus")


@dataclass
class CustomRewardFunctionConfig:
    """A user's ``compute_score(data_source, solution_str, ground_truth, extra_info)`` in a Python file.

    A null path keeps the built-in rule-based rewards, picked by each row's data source.
    """

    path: Optional[str] = None
    name: str = "compute_score"

    def __post_init__(self) -> None:
        _check(self, ["path"], lambda v: v is None or (isinstance(v, str) and v.strip() != ""),
               "must be null (built-in rewards) or the path of a Python file")
        _check(self, ["name"], lambda v: isinstance(v, str) and v.isidentifier(), "must be a Python function name")


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


# --------------------------------------------------------------------------------- building and loading


def to_dataclass(cfg: DictConfig) -> PPOConfig:
    """Build the typed ``PPOConfig`` from a composed config, running every component's ``__post_init__``."""
    try:
        return _build(PPOConfig, cfg, "")
    except OmegaConfBaseException as exc:  # e.g. an interpolation that does not resolve
        message = str(exc).splitlines()[0]
        raise ConfigError(f"{exc.full_key}: {message}" if exc.full_key else message) from exc


def _build(cls: type, node: DictConfig, path: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    for key in node.keys():
        if key not in names:
            raise ConfigError(_unknown_key_message(f"{path}.{key}" if path else str(key)))
    kwargs: dict[str, Any] = {}
    for name in names:
        value = node[name]  # resolves interpolations
        if is_dataclass(hints[name]):
            value = _build(hints[name], value, f"{path}.{name}" if path else name)
        elif isinstance(value, ListConfig):
            value = OmegaConf.to_container(value, resolve=True)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise (exc.under(path) if path else exc) from None


def load_config(overrides: Sequence[str] = (), config_name: str = "ppo_trainer") -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` (a preset such as ``qwen2_5_0_5b_gsm8k``) with Hydra-style ``overrides``
    (``["data.train_batch_size=8"]``) and validate it (components and batch arithmetic for ``num_workers(cfg)``
    workers)."""
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise _composition_error(exc) from exc
    validate_config(cfg, num_workers(cfg))
    return cfg


def _composition_error(exc: BaseException) -> ConfigError:
    """Turn Hydra's 'Could not override ...' / OmegaConf's type errors into a one-line ConfigError."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and cause.full_key:
        return ConfigError(_unknown_key_message(cause.full_key))
    if isinstance(cause, ValidationError) and cause.full_key:
        expected = _type_name(_schema_type(cause.full_key))
        return ConfigError.invalid(cause.full_key, cause.value, f"expected {expected}")
    lines = [ln for ln in str(exc).splitlines() if ln.strip() and not ln.startswith("See http")]
    return ConfigError(": ".join(lines[:2]))


def _unknown_key_message(full_key: str) -> str:
    parent, _, _ = full_key.rpartition(".")
    schema = _schema_type(parent) if parent else PPOConfig
    where = f"under {parent}" if parent else "top-level keys"
    valid = ", ".join(f.name for f in fields(schema)) if is_dataclass(schema) else "none"
    return f"unknown config key {full_key!r} (valid {where}: {valid})"


def _schema_type(full_key: str) -> Any:
    """The annotated type of ``full_key`` in the schema (list items by ``key[i]``); None when unknown."""
    tp: Any = PPOConfig
    for part in full_key.split("."):
        name = part.split("[")[0]
        if not is_dataclass(tp) or name not in typing.get_type_hints(tp):
            return None
        tp = typing.get_type_hints(tp)[name]
        if "[" in part:  # an item of a list field
            tp = (typing.get_args(tp) or (Any,))[0]
    return tp


def _type_name(tp: Any) -> str:
    if tp is None or tp is Any:
        return "another type"
    if is_dataclass(tp):
        return "a config group, not a value"
    if typing.get_origin(tp) is Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (list, List):
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    return "null" if tp is type(None) else tp.__name__


# ----------------------------------------------------------------------------------- cross-field checks


def num_workers(cfg: Any) -> int:
    """Worker processes (one per GPU, or per CPU slot on CPU): ``n_gpus_per_node × nnodes``."""
    return cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes


def uses_critic(cfg: Any) -> bool:
    """critic.enable, or when it is null, whether the advantage estimator needs values."""
    enable = cfg.critic.enable
    return estimator_needs_critic(cfg.algorithm.adv_estimator) if enable is None else bool(enable)


def validate_config(cfg: DictConfig | PPOConfig, n_workers: int) -> None:
    """Check every component, then the batch arithmetic the ``n_workers`` data-parallel workers rely on."""
    conf = cfg if isinstance(cfg, PPOConfig) else to_dataclass(cfg)
    if not _is_int(n_workers) or n_workers < 1:
        raise ConfigError(f"n_workers={n_workers}: must be a positive integer")
    data, rollout, actor, critic = conf.data, conf.actor_rollout_ref.rollout, conf.actor_rollout_ref.actor, conf.critic
    workers = f"{n_workers} workers (trainer.n_gpus_per_node × trainer.nnodes)"
    sequences = data.train_batch_size * rollout.n
    if sequences % n_workers:
        raise ConfigError(
            f"data.train_batch_size={data.train_batch_size} × actor_rollout_ref.rollout.n={rollout.n} = {sequences} "
            f"sequences per step cannot be split evenly across {workers}; make the product a multiple of {n_workers}"
        )
    _check_estimator(conf)
    _check_mini_batches("actor_rollout_ref.actor", actor, ("actor_rollout_ref.rollout.n", rollout.n),
                        data.train_batch_size, n_workers)
    if uses_critic(conf):
        _check_mini_batches("critic", critic, ("critic.rollout_n", critic.rollout_n), data.train_batch_size, n_workers)


def _check_mini_batches(
    prefix: str, role: ActorConfig | CriticConfig, n: tuple[str, int], train_batch_size: int, n_workers: int
) -> None:
    """mini | train_batch_size;  per-worker mini = mini·n / n_workers ∈ ℕ;  min(micro, it) | per-worker mini."""
    (n_key, n_value), mini, micro = n, role.ppo_mini_batch_size, role.ppo_micro_batch_size_per_gpu
    mini_text = f"{prefix}.ppo_mini_batch_size={mini}"
    if train_batch_size % mini:
        raise ConfigError(f"{mini_text}: must divide data.train_batch_size={train_batch_size} (both count prompts)")
    per_worker, remainder = divmod(mini * n_value, n_workers)
    if remainder:
        raise ConfigError(f"{mini_text} × {n_key}={n_value} = {mini * n_value} sequences per mini-batch cannot be "
                          f"split evenly across {n_workers} workers")
    if not role.use_dynamic_bsz and per_worker % min(micro, per_worker):  # a larger micro-batch is the mini-batch
        raise ConfigError(f"{prefix}.ppo_micro_batch_size_per_gpu={micro}: must divide the {per_worker} sequences "
                          f"of each worker's mini-batch ({mini_text} × {n_key}={n_value} / {n_workers} workers)")


def _check_estimator(conf: PPOConfig) -> None:
    estimator, n = conf.algorithm.adv_estimator, conf.actor_rollout_ref.rollout.n
    if "index" in ADV_ESTIMATORS[estimator].needs and n < 2:  # the baseline comes from the prompt's group
        raise ConfigError(f"actor_rollout_ref.rollout.n={n}: algorithm.adv_estimator={estimator} compares the "
                          "responses to one prompt, so it needs rollout.n > 1")
    needs_critic = estimator_needs_critic(estimator)
    if conf.critic.enable is False and needs_critic:
        raise ConfigError(f"critic.enable=false: algorithm.adv_estimator={estimator} needs a critic's values; "
                          "set critic.enable=true or null")
    if conf.critic.enable is True and not needs_critic:
        warnings.warn(f"critic.enable=true but algorithm.adv_estimator={estimator} does not use values; "
                      "the critic will be trained for nothing", stacklevel=3)


def resolve_device(cfg: Any) -> str:
    """trainer.device as a concrete "cuda" or "cpu" ("auto" picks CUDA when a device is visible)."""
    requested = cfg.trainer.device
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return "cpu"
    if not torch.cuda.is_available():
        raise ConfigError("trainer.device='cuda': no CUDA device is visible (torch.cuda.is_available() is False); "
                          "use trainer.device=cpu")
    visible, wanted = torch.cuda.device_count(), cfg.trainer.n_gpus_per_node
    if cfg.trainer.nnodes == 1 and wanted > visible:
        raise ConfigError(f"trainer.n_gpus_per_node={wanted}: only {visible} CUDA device(s) are visible")
    return "cuda"
