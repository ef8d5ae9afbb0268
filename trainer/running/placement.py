"""Which role workers one colocated process holds for a plan (``RayPPOTrainer.init_workers`` places them).

Each entry of ``planner.worker_roles.ROLES`` that the plan gives a worker of its own (``WorkerRole.placed``) is one
role worker of the process, by the name its methods get as a prefix (``WorkerRole.worker``): its class and
constructor arguments come from its entry. A rollout group of its own (``trainer.v1.trainer_mode=separate_async``)
holds the rollout's role alone (``rollout_class``).
"""

from __future__ import annotations

import importlib
from typing import Any

from config.schema import PPOConfig
from planner.phases import Step
from planner.plan import StepPlan
from planner.worker_roles import ROLES, WorkerRole
from single_controller.base.worker_group import ClassWithInitArgs


def placed_roles(cfg: PPOConfig, plan: StepPlan) -> tuple[WorkerRole, ...]:
    """The roles of ``plan`` that have a worker of their own, in the table's order."""
    s = Step(cfg, plan)
    return tuple(role for role in ROLES if role.placed(s))


def role_classes(cfg: PPOConfig, plan: StepPlan) -> dict[str, ClassWithInitArgs]:
    """The worker classes (with their arguments) of ``plan``'s roles, by the prefix their methods get."""
    return {role.worker: _with_args(role, cfg, plan) for role in placed_roles(cfg, plan)}


def _with_args(role: WorkerRole, cfg: PPOConfig, plan: StepPlan) -> ClassWithInitArgs:
    module, name = role.worker_class.split(":")
    return ClassWithInitArgs(getattr(importlib.import_module(module), name), **role.init_args(cfg, plan))


def rollout_class(cfg: PPOConfig, rollout_plan: StepPlan) -> Any:
    """The Ray worker of a rollout group of its own (a Ray run's alone): the role that generates, built for
    ``rollout_plan`` (the plan on that group's workers), whose weights the trainer's group sends
    (``workers.roles.weight_sync``)."""
    from single_controller.ray.placement import RayClassWithInitArgs

    role = next(role for role in ROLES if role.rollout)
    plain = _with_args(role, cfg, rollout_plan)
    return RayClassWithInitArgs(plain.cls, *plain.args, **plain.kwargs)
