"""The models a worker may hold, declared once: ``ROLES``, the other table beside ``config.phases.STEP_PHASES``.

An entry says where its model's path, model options and FSDP section sit in the config (verl's layout), whether it
trains, whether it ends in a value head, and whether a step plan places it. The memory estimate
(``trainer.preflight.memory_phases``) and the dry run (``trainer.preflight.dry_run``) read it; a phase's entry names
the role that computes it. Adding a role is an entry here plus its worker class (``workers.roles``) and its place in
``trainer.ppo_trainer.RayPPOTrainer.init_workers``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from config.distillation import teacher_fsdp_config, teacher_roles
from config.phases import ARR, Step, lookup


@dataclass(frozen=True)
class WorkerRole:
    """A model each worker may hold: the key of its ``path``, its ``model`` section (trust_remote_code,
    use_remove_padding, enable_gradient_checkpointing, where it has them), the key of the FSDP section that places
    it (``placement``), whether it trains, whether it ends in a value head (one output, not the vocabulary), whether
    LoRA ``adapters`` apply, and whether a plan places it (``held``). ``shares``: the role whose model this is, which
    computes its phases when it is not held (a LoRA actor is its own reference: its module, adapters disabled).
    ``instances``: a role of several models (distillation's teachers), each model's name -> the key of its path;
    ``fsdp``: its FSDP config when it is not the section at ``placement`` (the teachers': the reference's,
    offloaded)."""

    name: str
    path: str
    model: str
    placement: str
    trained: bool
    value_head: bool = False
    adapters: bool = False
    shares: str | None = None
    held: Callable[[Step], bool] = lambda s: True
    instances: Callable[[Any], dict[str, str]] | None = None
    fsdp: Callable[[Any], Any] | None = None

    def paths(self, cfg: Any) -> dict[str, str]:
        """The models of this role on a worker: each one's name -> the key of its path."""
        return self.instances(cfg) if self.instances else {self.name: self.path}

    def fsdp_config(self, cfg: Any) -> Any:
        """How this role's models are placed."""
        return self.fsdp(cfg) if self.fsdp else lookup(cfg, self.placement)


def _teachers(cfg: Any) -> dict[str, str]:
    """Distillation's teachers: ``teacher`` for one, ``teacher.<name>`` for each of several."""
    roles = teacher_roles(cfg.distillation)
    return {role: f"distillation.teacher_models.{name}.model_path" for role, name in roles.items()}


ROLES: tuple[WorkerRole, ...] = (
    WorkerRole("actor", f"{ARR}.model.path", f"{ARR}.model", f"{ARR}.actor.fsdp_config", trained=True, adapters=True),
    WorkerRole(
        "ref",
        f"{ARR}.model.path",
        f"{ARR}.model",
        f"{ARR}.ref.fsdp_config",
        trained=False,
        shares="actor",
        held=lambda s: s.plan.use_reference_policy and s.cfg.actor_rollout_ref.model.lora_rank == 0,
    ),
    WorkerRole(
        "critic",
        "critic.model.path",
        "critic.model",
        "critic.fsdp",
        True,
        value_head=True,
        held=lambda s: s.plan.use_critic,
    ),
    WorkerRole(  # verl's reward model section has its path and options in one place (no model sub-section)
        "rm",
        "reward.reward_model.model_path",
        "reward.reward_model",
        "reward.reward_model.fsdp_config",
        trained=False,
        value_head=True,
        held=lambda s: s.reward_model,
    ),
    WorkerRole(  # frozen, offloaded between its forwards (config.distillation.teacher_fsdp_config)
        "teacher",
        "distillation.teacher_models",
        f"{ARR}.model",
        f"{ARR}.ref.fsdp_config",  # the reference's placement, parameters offloaded (``fsdp``)
        trained=False,
        held=lambda s: s.plan.compute_teacher,
        instances=_teachers,
        fsdp=lambda cfg: teacher_fsdp_config(cfg.actor_rollout_ref),
    ),
)
ROLE = {role.name: role for role in ROLES}
