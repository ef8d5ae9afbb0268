"""``distillation.*``: on-policy distillation (OPD) with verl 0.9.1's keys, defaults and checks.

The student (the actor) samples, a frozen teacher scores every sampled token, and the actor's loss gains a
per-token divergence to the teacher (``algos.distillation``). verl runs each teacher as an inference server in a
resource pool of its own (``n_gpus_per_node``, ``nnodes``, each teacher's ``num_replicas`` and ``inference.*``);
ColoRL colocates the teacher with the other roles, so those keys are accepted and a value other than verl's
default warns (``teacher_warnings``), as the rollout's engine keys do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from algos.registry import DISTILLATION_LOSS_SPECS
from config.checks import ConfigError, check, is_int, non_negative, positive, show

DistillationLossMode = Literal[tuple(DISTILLATION_LOSS_SPECS)]  # type: ignore[valid-type]
DEFAULT_TEACHER = "teacher_model"  # verl's entry for a single teacher; dropped when other teachers are named
# what the teacher's phase writes for the actor's update: the sampled tokens' log-probs (B, R), or its top-k ids
# (int64) and log-probs (B, R, k): k values per token, never the vocabulary
TEACHER_LOG_PROBS = ("teacher_log_probs",)
TEACHER_TOPK = ("teacher_topk_ids", "teacher_topk_log_probs")


@dataclass(frozen=True)
class DistillationLossConfig:
    """``distillation.distillation_loss``: which divergence and how it enters the actor's loss."""

    _target_: str = "verl.workers.config.DistillationLossConfig"
    loss_mode: DistillationLossMode = "k3"
    topk: int | None = 32  # teacher tokens per position for forward_kl_topk
    use_task_rewards: bool = True  # add to the task's policy loss (× distillation_loss_coef); else replace it
    distillation_loss_coef: float = 1.0
    loss_max_clamp: float | None = None  # per-token losses clamped to ±this
    log_prob_min_clamp: float | None = None  # forward_kl_topk: log-probs clamped below at this
    use_policy_gradient: bool = False  # the negative divergence as each token's reward (PG OPD); else backpropagated
    policy_loss_mode: Literal["vanilla"] = "vanilla"  # verl supports only PPO's clipped loss here
    clip_ratio: float = 0.2
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2

    def __post_init__(self) -> None:
        check(self, ["topk"], lambda v: v is None or (is_int(v) and v > 0), "must be null or a positive integer")
        non_negative(self, "distillation_loss_coef")
        positive(self, "clip_ratio", "clip_ratio_low", "clip_ratio_high")
        check(self, ["loss_max_clamp"], lambda v: v is None or v > 0, "must be null or > 0")
        if DISTILLATION_LOSS_SPECS[self.loss_mode].uses_topk and self.topk is None:
            raise ConfigError.invalid("topk", self.topk, f"loss_mode={self.loss_mode} needs the teacher's top-k")
        if self.loss_mode in ("k1", "kl") and not self.use_policy_gradient:
            raise ConfigError.invalid(
                "loss_mode",
                self.loss_mode,
                "backpropagated directly, k1's gradient does not depend on the teacher; use it with "
                "use_policy_gradient=true, or use k3 or forward_kl_topk",
            )


@dataclass(frozen=True)
class TeacherInferenceConfig:
    """``teacher_models.<name>.inference``: verl's teacher inference server. ColoRL's teacher is a colocated FSDP
    forward; these keys are accepted and warn when set (null ones follow the student's rollout in verl)."""

    _target_: str = "verl.workers.config.RolloutConfig"
    name: str | None = None
    dtype: str | None = None
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    cudagraph_capture_sizes: Any = None
    free_cache_engine: bool = True
    data_parallel_size: int = 1
    expert_parallel_size: int = 1
    tensor_model_parallel_size: int = 2
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    max_num_seqs: int = 1024
    load_format: str = "auto"
    engine_kwargs: Any = field(default_factory=dict)
    limit_images: Any = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    disable_log_stats: bool = True
    skip_tokenizer_init: bool = True
    prompt_length: int | None = None
    response_length: int | None = None
    temperature: float | None = None


@dataclass(frozen=True)
class TeacherModelConfig:
    """``distillation.teacher_models.<name>``: one teacher; ``key`` routes rows to it among several."""

    _target_: str = "verl.workers.config.DistillationTeacherModelConfig"
    key: str | None = None
    model_path: str | None = None
    num_replicas: int = 0  # verl's inference replicas; ColoRL's teacher is one more role on every worker
    inference: TeacherInferenceConfig = field(default_factory=TeacherInferenceConfig)


@dataclass(frozen=True)
class DistillationConfig:
    """``distillation.*``. One teacher is ``teacher_models.teacher_model``; several are other names, each with a
    ``key`` matched against each row's ``teacher_key`` column (verl: ``teacher_model`` is then dropped)."""

    _target_: str = "verl.workers.config.DistillationConfig"
    enabled: bool = False
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)
    n_gpus_per_node: int = 8  # verl's teacher resource pool; ColoRL colocates the teacher
    nnodes: int = 0
    teacher_models: dict[str, TeacherModelConfig] = field(
        default_factory=lambda: {DEFAULT_TEACHER: TeacherModelConfig()}
    )
    teacher_key: str = "data_source"

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        teachers = active_teachers(self)
        keys = [teacher.key for teacher in teachers.values()]
        for name, teacher in teachers.items():
            if not teacher.model_path:
                raise ConfigError.invalid(
                    f"teacher_models.{name}.model_path", None, "distillation.enabled=true needs the teacher's model"
                )
            if len(teachers) > 1 and not teacher.key:
                raise ConfigError.invalid(
                    f"teacher_models.{name}.key",
                    None,
                    f"with several teachers each needs the {self.teacher_key} value of the rows it scores",
                )
        duplicates = sorted({key for key in keys if key is not None and keys.count(key) > 1})
        if len(teachers) > 1 and duplicates:
            raise ConfigError.invalid("teacher_models", sorted(teachers), f"teachers share the key(s) {duplicates}")


def active_teachers(config: DistillationConfig) -> dict[str, TeacherModelConfig]:
    """The teachers a run uses: ``teacher_model`` alone, or every other entry when there are several (verl's)."""
    teachers = dict(config.teacher_models)
    if len(teachers) > 1:
        teachers.pop(DEFAULT_TEACHER, None)
    return teachers


def teacher_warnings(config: DistillationConfig) -> list[str]:
    """One line per verl key of the teacher's own server or pool set away from verl's default (accepted, unused),
    as ``cli.inert`` words its lines."""
    if not config.enabled:
        return []
    colocated = "ColoRL's teacher is a frozen FSDP role on every worker, beside the actor"
    found = [
        (f"distillation.{key}", getattr(config, key), getattr(DistillationConfig(), key), "it has no pool of its own")
        for key in ("n_gpus_per_node", "nnodes")
    ]
    for name, teacher in active_teachers(config).items():
        prefix = f"distillation.teacher_models.{name}"
        found.append((f"{prefix}.num_replicas", teacher.num_replicas, 0, "it is no inference server"))
        found += [
            (
                f"{prefix}.inference.{f.name}",
                getattr(teacher.inference, f.name),
                getattr(TeacherInferenceConfig(), f.name),
                "not an inference server",
            )
            for f in fields(TeacherInferenceConfig)
        ]
    return [
        f"{key}={show(value)}: {colocated}, {why}; set {key}={show(default)} to silence this"
        for key, value, default, why in found
        if value != default
    ]


def teacher_roles(config: DistillationConfig) -> dict[str, str]:
    """The teachers a worker holds, by the name the memory estimate and the dry run give them (``teacher`` for one,
    ``teacher.<name>`` for each of several) -> their ``teacher_models`` entry; empty without distillation."""
    if not config.enabled:
        return {}
    names = list(active_teachers(config))
    return {"teacher": names[0]} if len(names) == 1 else {f"teacher.{name}": name for name in names}


def uses_topk(config: DistillationConfig) -> bool:
    """The loss reads the teacher's top-k (``forward_kl_topk``), not its sampled-token log-probs."""
    return DISTILLATION_LOSS_SPECS[config.distillation_loss.loss_mode].uses_topk


def teacher_outputs(config: DistillationConfig) -> tuple[str, ...]:
    """The per-token keys the teacher's phase writes and the actor's update reads (none without distillation)."""
    if not config.enabled:
        return ()
    return TEACHER_TOPK if uses_topk(config) else TEACHER_LOG_PROBS


def teacher_columns(config: DistillationConfig) -> tuple[str, ...]:
    """The per-row column that routes rows to teachers (``teacher_key``) when there are several; none for one."""
    return (config.teacher_key,) if config.enabled and len(active_teachers(config)) > 1 else ()


def teacher_fsdp_config(actor_rollout_ref: Any) -> Any:
    """How a teacher is placed: the reference's ``fsdp_config`` (precision, wrap policy, resharding), with its
    parameters offloaded between its forwards whatever ``ref.fsdp_config.param_offload`` says: the teacher computes
    once a step (verl has no key for it: its teacher is an inference server of its own)."""
    return dataclasses.replace(actor_rollout_ref.ref.fsdp_config, param_offload=True)
