"""``distillation.*``: on-policy distillation (OPD), its keys, defaults and checks.

The student (the actor) samples, a frozen teacher scores every sampled token, and the actor's loss gains a
per-token divergence to the teacher (``algos.distillation``). Each teacher is colocated with the other roles: one
more frozen FSDP role on every worker.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from algos.registry import DISTILLATION_LOSS_SPECS
from config.checks import ConfigError, check, is_int, non_negative, positive

DistillationLossMode = Literal[tuple(DISTILLATION_LOSS_SPECS)]  # type: ignore[valid-type]
DEFAULT_TEACHER = "teacher_model"  # the entry of a single teacher; dropped when other teachers are named
# what the teacher's phase writes for the actor's update: the sampled tokens' log-probs (B, R), or its top-k ids
# (int64) and log-probs (B, R, k): k values per token, never the vocabulary
TEACHER_LOG_PROBS = ("teacher_log_probs",)
TEACHER_TOPK = ("teacher_topk_ids", "teacher_topk_log_probs")


@dataclass(frozen=True)
class DistillationLossConfig:
    """``distillation.distillation_loss``: which divergence and how it enters the actor's loss."""

    loss_mode: DistillationLossMode = "k3"
    topk: int | None = 32  # teacher tokens per position for forward_kl_topk
    use_task_rewards: bool = True  # add to the task's policy loss (× distillation_loss_coef); else replace it
    distillation_loss_coef: float = 1.0
    loss_max_clamp: float | None = None  # per-token losses clamped to ±this
    log_prob_min_clamp: float | None = None  # forward_kl_topk: log-probs clamped below at this
    use_policy_gradient: bool = False  # the negative divergence as each token's reward (PG OPD); else backpropagated
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
class TeacherModelConfig:
    """``distillation.teacher_models.<name>``: one teacher; ``key`` routes rows to it among several."""

    key: str | None = None
    model_path: str | None = None


@dataclass(frozen=True)
class DistillationConfig:
    """``distillation.*``. One teacher is ``teacher_models.teacher_model``; several are other names, each with a
    ``key`` matched against each row's ``teacher_key`` column (``teacher_model`` is then dropped)."""

    enabled: bool = False
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)
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
    """The teachers a run uses: ``teacher_model`` alone, or every other entry when there are several."""
    teachers = dict(config.teacher_models)
    if len(teachers) > 1:
        teachers.pop(DEFAULT_TEACHER, None)
    return teachers


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
    once a step (no key sets it)."""
    return dataclasses.replace(actor_rollout_ref.ref.fsdp_config, param_offload=True)
