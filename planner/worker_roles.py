"""The models a worker may hold, declared once: ``ROLES``, the other table beside ``planner.phases.STEP_PHASES``.

An entry says where its model's path, model options and FSDP section sit in the config, whether it
trains, whether it ends in a value head, whether a step plan places it, and its worker: the class, its arguments and
the driver's worker group that calls it. Everything that knows about roles reads this table: the placement
(``trainer.running.placement``), ``RayPPOTrainer.init_workers`` and the driver's group of each phase
(``trainer.running.step``), the checkpoints and the resume check of the trained roles (``trainer.state.fingerprint``),
the memory estimate (``trainer.preflight.memory_phases``) and the dry run (``trainer.preflight.dry_run``); a phase's
entry names the role that computes it. Adding a role is an entry here plus its worker class (``workers.roles``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from config.distillation import teacher_fsdp_config, teacher_roles
from config.tree import ARR
from planner.phases import Step


@dataclass(frozen=True)
class WorkerRole:
    """A model each worker may hold: the key of its ``path`` and of its ``model`` section (trust_remote_code,
    use_remove_padding, enable_gradient_checkpointing, where it has them), for messages, and the functions that read
    them from a config: ``model_config`` (the section), ``model_path`` (the path) and ``fsdp`` (the FSDP section
    that places it; the teachers': the reference's, offloaded); whether it trains, whether it ends in a value head
    (one output, not the vocabulary), whether LoRA ``adapters`` apply, and whether a plan places it (``held``).
    ``shares``: the role whose model this is, which computes its phases when it is not held (a LoRA actor is its own
    reference: its module, adapters disabled). ``instances``: a role of several models (distillation's teachers),
    each model's name -> (the key of its path, the path). ``worker``: the name of its worker in the colocated process
    (its methods' prefix; the driver calls
    it through its attribute ``group``), ``worker_class`` (``module:Class``) and ``init_args`` its constructor's
    arguments for a config and plan; ``own_worker``: whether the plan gives it a worker of its own (default:
    ``held``; else its phases run on the worker of the role it ``shares``); ``rollout``: it holds the rollout engine,
    which sizes its cache by what the other models leave, so it loads last."""

    name: str
    path: str
    model: str
    model_config: Callable[[Any], Any]
    model_path: Callable[[Any], str | None]
    fsdp: Callable[[Any], Any]
    trained: bool
    value_head: bool = False
    adapters: bool = False
    shares: str | None = None
    held: Callable[[Step], bool] = lambda s: True
    instances: Callable[[Any], dict[str, tuple[str, str | None]]] | None = None
    worker: str = ""
    worker_class: str = ""
    init_args: Callable[[Any, Any], dict[str, Any]] = lambda cfg, plan: {}
    own_worker: Callable[[Step], bool] | None = None
    rollout: bool = False

    @property
    def group(self) -> str:
        """The driver's attribute that holds this role's worker group (``actor_rollout_wg``, ...)."""
        return f"{self.worker}_wg"

    def placed(self, s: Step) -> bool:
        """Whether plan ``s`` gives this role a worker of its own."""
        return (self.own_worker or self.held)(s)

    def paths(self, cfg: Any) -> dict[str, tuple[str, str | None]]:
        """The models of this role on a worker: each one's name -> (the key of its path, the path)."""
        return self.instances(cfg) if self.instances else {self.name: (self.path, self.model_path(cfg))}


def _teachers(cfg: Any) -> dict[str, tuple[str, str | None]]:
    """Distillation's teachers: ``teacher`` for one, ``teacher.<name>`` for each of several."""
    models = cfg.distillation.teacher_models
    return {
        role: (f"distillation.teacher_models.{name}.model_path", models[name].model_path)
        for role, name in teacher_roles(cfg.distillation).items()
    }


def _arr_model(cfg: Any) -> Any:
    return cfg.actor_rollout_ref.model


WORKERS, SCORING = "workers.roles.fsdp_workers", "workers.roles.scoring_workers"
ROLES: tuple[WorkerRole, ...] = (
    WorkerRole(
        "actor",
        f"{ARR}.model.path",
        f"{ARR}.model",
        _arr_model,
        lambda cfg: cfg.actor_rollout_ref.model.path,
        lambda cfg: cfg.actor_rollout_ref.actor.fsdp_config,
        trained=True,
        adapters=True,
        worker="actor_rollout",
        worker_class=f"{WORKERS}:ActorRolloutRefWorker",
        # the exact KL loss reads reference logits inside the update, and a LoRA actor is its own reference
        # (adapters disabled): then one object holds actor and ref
        init_args=lambda cfg, plan: dict(
            config=cfg.actor_rollout_ref,
            role="actor_rollout_ref" if plan.ref_in_actor else "actor_rollout",
            plan=plan,
            distillation=cfg.distillation,
        ),
        rollout=True,
    ),
    WorkerRole(
        "ref",
        f"{ARR}.model.path",
        f"{ARR}.model",
        _arr_model,
        lambda cfg: cfg.actor_rollout_ref.model.path,
        lambda cfg: cfg.actor_rollout_ref.ref.fsdp_config,
        trained=False,
        shares="actor",
        held=lambda s: s.plan.use_reference_policy and s.cfg.actor_rollout_ref.model.lora_rank == 0,
        worker="ref",
        worker_class=f"{WORKERS}:ActorRolloutRefWorker",
        init_args=lambda cfg, plan: dict(config=cfg.actor_rollout_ref, role="ref", plan=plan),
        own_worker=lambda s: s.plan.use_reference_policy and not s.plan.ref_in_actor,
    ),
    WorkerRole(
        "critic",
        "critic.model.path",
        "critic.model",
        lambda cfg: cfg.critic.model,
        lambda cfg: cfg.critic.model.path,
        lambda cfg: cfg.critic.fsdp,
        trained=True,
        value_head=True,
        held=lambda s: s.plan.use_critic,
        worker="critic",
        worker_class=f"{SCORING}:CriticWorker",
        init_args=lambda cfg, plan: dict(config=cfg.critic, plan=plan),
    ),
    WorkerRole(  # the reward model's section has its path and options in one place (no model sub-section)
        "rm",
        "reward.reward_model.model_path",
        "reward.reward_model",
        lambda cfg: cfg.reward.reward_model,
        lambda cfg: cfg.reward.reward_model.model_path,
        lambda cfg: cfg.reward.reward_model.fsdp_config,
        trained=False,
        value_head=True,
        held=lambda s: s.reward_model,
        worker="rm",
        worker_class=f"{SCORING}:RewardModelWorker",
        init_args=lambda cfg, plan: dict(config=cfg.reward.reward_model),
    ),
    WorkerRole(  # frozen, offloaded between its forwards (config.distillation.teacher_fsdp_config)
        "teacher",
        "distillation.teacher_models",
        f"{ARR}.model",
        _arr_model,
        lambda cfg: None,  # each teacher's is its entry's (``instances``)
        lambda cfg: teacher_fsdp_config(cfg.actor_rollout_ref),  # the reference's placement, parameters offloaded
        trained=False,
        held=lambda s: s.plan.compute_teacher,
        instances=_teachers,
        worker="teacher",
        worker_class=f"{SCORING}:TeacherWorker",
        init_args=lambda cfg, plan: dict(config=cfg.distillation, actor_rollout_ref=cfg.actor_rollout_ref, plan=plan),
    ),
)
ROLE = {role.name: role for role in ROLES}
ACTOR, REF, CRITIC, RM, TEACHER = ROLES  # for the readers that single one out
