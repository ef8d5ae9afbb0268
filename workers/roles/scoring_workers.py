"""Ray-side role workers that score or value the actor's samples, on FSDP2: the distillation teachers, the critic
and the reward model (the actor/rollout/reference worker and the process helpers are ``fsdp_workers``).

Each data method is one phase of ``planner.phases``, with its inputs from ``STORE.inputs`` and its results to
``STORE.outputs`` (``workers/compute/step_store.py``), as in ``fsdp_workers``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from config.distillation import active_teachers, teacher_fsdp_config, uses_topk
from planner.plan import StepPlan
from single_controller.base.register import Dispatch, register
from single_controller.base.worker import Worker
from single_controller.data_proto import DataProto
from workers.compute.critic import DataParallelPPOCritic, load_value_model
from workers.compute.reward_model import compute_rm_scores, load_reward_model
from workers.compute.step_store import STORE
from workers.compute.teacher import merge_by_rows, score_batch, teacher_rows
from workers.roles.fsdp_workers import check_world, setup_process
from workers.roles.role import FrozenRole, TrainedRole


class TeacherWorker(Worker):
    """The frozen distillation teachers (``distillation.teacher_models``), each a causal LM sharded like the
    reference (``actor_rollout_ref.ref.fsdp_config``) and offloaded between its forwards (``FrozenRole``): on CUDA
    its parameters wait in host memory; on a CPU the device is host memory, so nothing moves, and what the teacher
    holds between forwards is its FSDP shard (1/n of its weights on each of n workers; the gathered copy of a
    forward is freed when it ends). ``config`` is the ``distillation`` section, ``actor_rollout_ref`` the student's:
    its model's remove-padding and fused-kernel settings, the actor's prefix grouper and the rollout's log-prob
    micro-batches shape the teacher's forwards as they do the old log-probs'."""

    def __init__(self, config: Any, actor_rollout_ref: Any, plan: StepPlan) -> None:
        super().__init__()
        check_world(self, plan)
        self.config, self.arr, self.plan = config, actor_rollout_ref, plan

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int = 0, seed: int = 1, deterministic: bool = False) -> None:
        """Load every teacher and shard it (``total_training_steps`` is unused: teachers do not train)."""
        setup_process(self, seed, deterministic)
        trust = self.arr.model.trust_remote_code
        self.teachers = {
            name: FrozenRole(
                self,
                AutoModelForCausalLM.from_pretrained(teacher.model_path, dtype=torch.float32, trust_remote_code=trust),
                teacher_fsdp_config(self.arr),
            )
            for name, teacher in active_teachers(self.config).items()
        }

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """The teachers' scores of the responses (``workers.compute.teacher``): ``teacher_log_probs`` (B, R), or
        ``teacher_topk_ids`` and ``teacher_topk_log_probs`` (B, R, k) for the top-k loss."""
        inputs, rollout, model = STORE.inputs(data), self.arr.rollout, self.arr.model
        rows = teacher_rows(inputs, active_teachers(self.config), self.config.teacher_key)
        loss = self.config.distillation_loss
        scores = {}
        for name, teacher in self.teachers.items():
            with teacher.onloaded():
                scores[name] = score_batch(
                    teacher.module,
                    inputs,
                    rollout.log_prob_micro_batch_size_per_gpu,
                    rollout.log_prob_max_token_len_per_gpu if rollout.log_prob_use_dynamic_bsz else None,
                    model.use_remove_padding,
                    model.use_fused_kernels,
                    loss.topk if uses_topk(self.config) else None,
                    share_prompts=self.arr.actor.use_prefix_grouper,
                )
        out = next(iter(scores.values())) if rows is None else merge_by_rows(scores, rows)
        return STORE.outputs(data, out)


class CriticWorker(Worker):
    """The value model. ``config`` is the ``critic`` section (``config.model.path`` resolved by the trainer)."""

    def __init__(self, config: Any, plan: StepPlan) -> None:
        super().__init__()
        check_world(self, plan)
        self.config, self.plan = config, plan

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int = 0, seed: int = 1, deterministic: bool = False) -> None:
        """Load the value model (zero-initialised head), shard it, build optimizer and LR schedule."""
        cfg = self.config
        setup_process(self, seed, deterministic)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
        model = load_value_model(cfg.model.path, cfg.model.trust_remote_code, cfg.model.override_config)
        if cfg.model.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.trained = TrainedRole(self, model, cfg.fsdp, cfg.optim, total_training_steps)
        self.critic = DataParallelPPOCritic(
            self.trained.module,
            self.trained.optimizer,
            self.trained.lr_scheduler,
            cfg,
            self.plan.critic_mini_batch_size,
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R): V(s) before each response token, zero outside the response mask."""
        with self.trained.onloaded():
            values = self.critic.compute_values(STORE.inputs(data))
        return STORE.outputs(data, {"values": values})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        """One value-loss update on this rank's rows; returns ``meta_info["metrics"]``."""
        inputs = STORE.inputs(data)
        return self.trained.update("critic", inputs, lambda: self.critic.update_critic(inputs), self.config.ppo_epochs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Write the value model under ``path`` (HF directory + optimizer, scheduler, RNG state)."""
        self.trained.save(path, self.tokenizer)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what ``save_checkpoint`` wrote (from any world size)."""
        self.trained.load(path)


class RewardModelWorker(Worker):
    """A frozen sequence-classification reward model. ``config`` is the ``reward.reward_model`` section.

    It scores the policy's token ids as they are: the RM must share the policy's tokenizer (a different
    RM tokenizer, with decode and re-encode, is not supported yet).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int = 0, seed: int = 1, deterministic: bool = False) -> None:
        """Load the reward model and shard it (``total_training_steps`` is unused: it does not train)."""
        setup_process(self, seed, deterministic)
        self.rm = FrozenRole(self, load_reward_model(self.config.model_path), self.config.fsdp_config)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` (B, R): each sequence's score at its last valid response token, 0 elsewhere."""
        with self.rm.onloaded():
            scores = compute_rm_scores(self.rm.module, STORE.inputs(data), self.config.micro_batch_size_per_gpu)
        return STORE.outputs(data, {"rm_scores": scores})
