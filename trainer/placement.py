"""Which role workers one colocated process holds for a plan (``RayPPOTrainer.init_workers`` places them).

Each entry of ``config.worker_roles.ROLES`` that the plan places computes its phases on one of these, by the name
``init_workers`` maps it to: the actor (+ rollout, and the reference when it lives in the actor's process), the
reference, the critic, the reward model and distillation's teachers. A rollout group of its own
(``trainer.v1.trainer_mode=separate_async``) holds the actor alone (``rollout_class``).
"""

from __future__ import annotations

from config.plan import StepPlan
from config.schema import PPOConfig
from single_controller.ray import RayClassWithInitArgs
from workers.roles.fsdp_workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker, TeacherWorker


def role_classes(cfg: PPOConfig, plan: StepPlan) -> dict[str, RayClassWithInitArgs]:
    """The worker classes (with their arguments) of ``plan``'s roles, by the prefix their methods get."""
    arr = cfg.actor_rollout_ref
    # the exact KL loss reads reference logits inside the update, and a LoRA actor is its own reference
    # (adapters disabled): then one object holds actor and ref
    actor_role = "actor_rollout_ref" if plan.ref_in_actor else "actor_rollout"
    roles = {
        "actor_rollout": RayClassWithInitArgs(
            ActorRolloutRefWorker, config=arr, role=actor_role, plan=plan, distillation=cfg.distillation
        )
    }
    if plan.use_reference_policy and not plan.ref_in_actor:
        roles["ref"] = RayClassWithInitArgs(ActorRolloutRefWorker, config=arr, role="ref", plan=plan)
    if plan.use_critic:
        roles["critic"] = RayClassWithInitArgs(CriticWorker, config=cfg.critic, plan=plan)
    if cfg.reward.reward_model.enable:
        roles["rm"] = RayClassWithInitArgs(RewardModelWorker, config=cfg.reward.reward_model)
    if plan.compute_teacher:  # on-policy distillation: frozen teachers, offloaded between their forwards
        roles["teacher"] = RayClassWithInitArgs(
            TeacherWorker, config=cfg.distillation, actor_rollout_ref=arr, plan=plan
        )
    return roles


def rollout_class(cfg: PPOConfig, rollout_plan: StepPlan) -> RayClassWithInitArgs:
    """The worker of a rollout group of its own: the actor, whose rollout generates and whose weights the trainer's
    group sends (``workers.roles.weight_sync``); ``rollout_plan`` is the plan on that group's workers."""
    return RayClassWithInitArgs(
        ActorRolloutRefWorker, config=cfg.actor_rollout_ref, role="actor_rollout", plan=rollout_plan
    )
