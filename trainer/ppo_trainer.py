"""The PPO driver: one process that writes the RL dataflow as plain calls on worker groups.

Every model lives in the workers: one ``WorkerDict`` process per device holds the actor (+ rollout), the reference
policy, the critic and distillation's teachers (colocation: ``trainer.placement``). The driver calls them phase by
phase and computes rewards and advantages, which are cheap tensor maths over the whole batch. ``train_step`` runs the
phases of the table ``config.phases.STEP_PHASES`` in its order, one timed line each; a worker phase's role and
method come from its entry. Tensors stay where they are next read: each call sends only what the driver holds of
what the phase reads, and takes back only what a driver phase reads (the routes of ``config.phases.declare_flows``);
the rest stays in the workers' step store.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

import algos
from config.phases import GREEDY_FLOW, PHASES, STEP_FLOW, VALIDATION_FLOW
from config.plan import StepPlan
from config.schema import PPOConfig
from single_controller import DataProto
from single_controller.ray import RayResourcePool, RayWorkerGroup, create_colocated_worker_cls
from single_controller.ray.health import shutdown_worker_group, stall_report
from trainer.advantage import compute_advantage
from trainer.ahead import Ahead
from trainer.balance import balance_batch
from trainer.checkpoint import CheckpointError, CheckpointManager, load_driver_state
from trainer.data_position import DataPosition
from trainer.dynamic_sampling import collect
from trainer.fingerprint import config_record
from trainer.generations import GenerationLog
from trainer.health import HealthMonitor, NonFiniteGuard
from trainer.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    multi_turn_metrics,
    reduce_metrics,
    reward_group_metrics,
    rollout_probs_diff,
    timed,
)
from trainer.placement import role_classes
from trainer.preemption import StopSignals
from trainer.report import RunReport
from trainer.routing import STEP_TOKEN, request, take_back
from trainer.run_dir import open_run
from trainer.tracking import Tracking
from trainer.validation import ValidationTally
from trainer.watchdog import PhaseWatchdog
from workers.runtime import malloc

RewardFn = Callable[[DataProto], tuple[torch.Tensor, dict]]


class RayPPOTrainer:
    """PPO / GRPO over colocated FSDP workers. ``fit`` is the algorithm; ``init_workers`` the placement."""

    def __init__(
        self,
        config: PPOConfig,
        tokenizer: Any,
        train_dataloader: Any,
        val_dataloader: Any,
        reward_fn: RewardFn,
        val_reward_fn: RewardFn,
        plan: StepPlan,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.train_dataloader = train_dataloader
        self.val_dataloader = val_dataloader
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn
        self.plan = plan  # which phases run, which keys travel, per-rank batch sizes (config.plan)
        kl_ctrl = config.algorithm.kl_ctrl
        self.kl_ctrl_in_reward = algos.get_kl_controller(
            kl_ctrl.type, kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon
        )
        steps_per_epoch = len(train_dataloader)
        self.total_training_steps = config.trainer.total_training_steps or steps_per_epoch * config.trainer.total_epochs
        self.global_step = 0
        self.data = DataPosition(train_dataloader)  # saved with checkpoints: a resumed run draws the same batches
        self.wandb_run_id: str | None = None
        self.nonfinite = NonFiniteGuard(config.trainer.max_nonfinite_steps)  # NaN/inf steps: k in a row stop the run
        self.health = HealthMonitor(config.trainer.health, config.data.max_response_length)
        self.generations = GenerationLog(config.trainer, tokenizer)  # dumps and the report's samples
        self.checkpoints = CheckpointManager(
            config.trainer.default_local_dir,
            config.trainer.max_actor_ckpt_to_keep,
            config.trainer.max_critic_ckpt_to_keep,
        )
        self.resume_from = open_run(config, self.checkpoints)  # locked; the checkpoint to continue from, config checked
        self.watchdog = PhaseWatchdog(  # a phase past trainer.phase_timeout_s: stacks of every rank, exit 3
            {},
            config.trainer.phase_timeout_s,
            dump_fn=lambda: stall_report([p for group in self.worker_groups() for p in group.processes]),
            teardown_fn=lambda: [shutdown_worker_group(group) for group in self.worker_groups()],
        )
        self.ahead: Ahead | None = None  # trainer.v1's async modes: the batches generated ahead (trainer.ahead)

    # ------------------------------------------------------------------ placement
    def init_workers(self) -> None:
        """Start one WorkerDict per device holding every role, then build the models (actor last)."""
        cfg, plan = self.config, self.plan
        trainer = cfg.trainer
        pool = RayResourcePool(
            [trainer.n_gpus_per_node] * trainer.nnodes, use_gpu=trainer.device == "cuda", max_colocate_count=1
        )
        roles = role_classes(cfg, plan)  # the role workers of one process (trainer.placement)
        # on a CPU, mimalloc's malloc in every worker: glibc's fragments under a training step
        # (workers/runtime/malloc.py)
        self.fused_wg = RayWorkerGroup(
            pool, create_colocated_worker_cls(roles), worker_env=malloc.worker_env(trainer.device)
        )
        where = ", ".join(
            f"rank {rank} pid {p['pid']} on {p['node_ip']} (node {p['node_id'][:8]})"
            for rank, p in enumerate(self.fused_wg.processes)
        )
        print(f"[colorl] workers: {where}", flush=True)
        views = self.fused_wg.spawn(prefix_set=roles.keys())
        self.actor_rollout_wg = views["actor_rollout"]
        self.ref_wg = self.actor_rollout_wg if plan.ref_in_actor else views.get("ref")
        self.critic_wg = views.get("critic")
        self.rm_wg = views.get("rm")
        self.teacher_wg = views.get("teacher")
        with self.watchdog.phase("init_model"):  # loading a model from a shared file system can hang too
            for wg in (self.critic_wg, views.get("ref"), self.rm_wg, self.teacher_wg, self.actor_rollout_wg):
                if wg is not None:
                    wg.init_model(self.total_training_steps, seed=trainer.seed, deterministic=trainer.deterministic)
            if plan.mode.asynchronous:  # separate_async: the rollout group starts here
                self.ahead = Ahead.start(cfg, plan, self.actor_rollout_wg, self.total_training_steps)

    def worker_groups(self) -> list[RayWorkerGroup]:
        """The groups of worker processes placed so far: the fused one, and a rollout group of its own."""
        groups = [getattr(self, "fused_wg", None)]
        if self.ahead is not None and self.ahead.separate:
            groups.append(self.ahead.rollout_group)
        return [group for group in groups if group is not None]

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """Train (or resume) up to ``total_training_steps``; returns the last step's metrics."""
        cfg = self.config.trainer
        resumed = self.load_checkpoint()
        if self.ahead is not None:
            self.ahead.begin(self.global_step)
        self.generations.drop_steps_after(self.global_step)  # a resumed run computes the later steps again
        self.logger = Tracking(
            project_name=cfg.project_name,
            experiment_name=cfg.experiment_name,
            backends=list(cfg.logger),
            config=dataclasses.asdict(self.config),
            local_dir=cfg.default_local_dir,
            total_steps=self.total_training_steps,
            resume_id=self.wandb_run_id,
            resume_step=self.global_step,  # steps logged after it are computed again: one history
        )
        self.wandb_run_id = self.logger.wandb_run_id
        self.report = RunReport(self.config)  # <default_local_dir>/report.html, at each validation and the end
        start, last, stop = time.monotonic(), {}, StopSignals().install()  # SIGTERM/SIGINT: save, then stop
        try:
            if self.val_dataloader is not None and cfg.val_before_train and not resumed:
                last = self.validate()
                self.logger.log(self.health.observe(last, self.global_step), step=self.global_step)
                self.report.write(self.logger.records(), self.health.fired)
            batches = self.data.batches()
            while self.global_step < self.total_training_steps and not cfg.val_only:  # val_only: validate, stop
                self.global_step += 1
                last = self.train_step(next(batches), batches)
                last["training/epoch"] = float(self.data.epoch)
                self.nonfinite.check(last, self.global_step, self.checkpoints.latest())
                # with dynamic sampling and no total_training_steps, a run also ends once it has drawn total_epochs
                # passes over the data (verl's DAPO loop), which may come before the step count
                used_up = self.plan.dynamic_sampling and self.data.epochs_drawn() >= cfg.total_epochs
                done = self.global_step >= self.total_training_steps or (used_up and cfg.total_training_steps is None)
                out_of_time = cfg.max_wall_time_s is not None and time.monotonic() - start > cfg.max_wall_time_s
                last_step = done or out_of_time  # verl validates and saves at the last step when its freq > 0
                validated = self.val_dataloader is not None and _due(cfg.test_freq, self.global_step, last_step)
                timing: dict[str, float] = {}
                if validated:
                    with timed("testing", timing):
                        last.update(self.validate())
                preempted = stop.signal is not None  # read once: a signal after the save waits for the next step
                if preempted or _due(cfg.save_freq, self.global_step, last_step):  # preempted: save to resume
                    with self._phase("save_checkpoint", timing):
                        self.save_checkpoint()
                last.update({f"timing_s/{name}": seconds for name, seconds in timing.items()})
                last = self.health.observe(last, self.global_step)  # health metrics; warns once when a pattern holds
                self.logger.log(last, step=self.global_step)
                if validated:
                    self.report.write(self.logger.records(), self.health.fired)
                if out_of_time or preempted:
                    break
        finally:
            stop.restore()
            self.logger.finish()
            self.report.write(self.logger.records(), self.health.fired)
        if stop.signal and self.global_step < self.total_training_steps:
            raise stop.preempted(self.global_step, self.checkpoints.checkpoints()[-1])
        return last

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Write the workers' and the driver's state for this step; the previous checkpoint stays intact on failure."""
        staging = self.checkpoints.staging_path(self.global_step)
        try:
            self.checkpoints.make_staging(staging)
            self.actor_rollout_wg.save_checkpoint(str(staging / "actor"))
            if self.critic_wg is not None:
                self.critic_wg.save_checkpoint(str(staging / "critic"))
            return self.checkpoints.commit(staging, self.global_step, self._driver_state())
        except OSError as exc:  # a worker's OSError reaches us as a RayTaskError that is also an OSError
            self.checkpoints.abandon(staging)
            previous = self.checkpoints.latest()
            raise CheckpointError(
                f"saving the checkpoint of step {self.global_step} failed ({getattr(exc, 'cause', exc)}); "
                f"the previous checkpoint is intact: {previous or 'none yet'}"
            ) from exc

    def _driver_state(self) -> dict[str, Any]:
        return {
            "global_step": self.global_step,
            **self.data.state(),
            "kl_ctrl": self.kl_ctrl_in_reward.state_dict(),
            "wandb_run_id": self.wandb_run_id,
            "config": config_record(self.config),  # compared on resume (trainer.fingerprint)
            **({"ahead": self.ahead.state()} if self.ahead is not None else {}),
        }

    def load_checkpoint(self) -> bool:
        """Load the checkpoint ``open_run`` picked (``trainer.resume_mode``); True when there was one."""
        path = self.resume_from
        if path is None:
            return False
        if self.critic_wg is not None and not (path / "critic").exists():
            raise CheckpointError(f"{path} has no critic/ to resume the critic from (saved by a run without one?)")
        try:
            with self.watchdog.phase("load_checkpoint"):
                self.actor_rollout_wg.load_checkpoint(str(path / "actor"))
                if self.critic_wg is not None:
                    self.critic_wg.load_checkpoint(str(path / "critic"))
        except (ValueError, FileNotFoundError) as exc:  # raised in a worker: a different model, missing files
            raise CheckpointError(f"cannot resume from {path}: {getattr(exc, 'cause', exc)}") from exc
        state = load_driver_state(path)
        self.global_step = state["global_step"]
        self.data.load(state)
        self.kl_ctrl_in_reward.load_state_dict(state["kl_ctrl"])
        self.wandb_run_id = state["wandb_run_id"]
        if self.ahead is not None:
            self.ahead.load(state["ahead"])
        print(f"[colorl] resumed from {path} (step {self.global_step})", flush=True)
        return True

    def train_step(self, batch: DataProto, more: Iterator[DataProto] | None = None) -> dict[str, float]:
        """One PPO iteration on a batch of prompts: the phases of ``config.phases.STEP_PHASES`` in their order, one
        timed line each; a phase this plan does not run is skipped (``StepPlan.runs``). With dynamic sampling
        (``trainer.dynamic_sampling``) ``batch`` is the first generation batch and ``more`` gives the next ones."""
        timing: dict[str, float] = {}
        metrics: dict[str, Any] = {}
        with timed("step", timing):
            sample = functools.partial(self._sample, timing=timing)
            if self.plan.dynamic_sampling:  # generation batches until the step's prompts are collected
                cfg = self.config
                batch, reward_extras, sampled = collect(
                    batch,
                    more,
                    sample,
                    cfg.data.train_batch_size,
                    cfg.actor_rollout_ref.rollout.n,
                    cfg.algorithm.filter_groups,
                )
                batch.meta_info[STEP_TOKEN] = uuid.uuid4().hex  # the workers keep the training phases' under it
                if self.plan.balance_batch:  # filter_groups balances the rows it keeps, as verl's DAPO loop
                    sampled.update(self._balance(batch, reward_extras))
            else:
                batch, reward_extras, sampled = sample(batch, more=more)
            metrics.update(sampled)
            metrics.update(self._worker("old_log_prob", batch, timing))
            metrics.update(self._worker("ref", batch, timing))
            metrics.update(self._worker("teacher", batch, timing))  # after the filter: only the rows that train
            metrics.update(self._worker("values", batch, timing))
            with self._phase("adv", timing):
                compute_advantage(
                    batch, self.config.algorithm, self.plan, self.kl_ctrl_in_reward, metrics, reward_extras
                )
            metrics.update(self._worker("update_critic", batch, timing))
            if self.global_step >= self.config.trainer.critic_warmup:  # verl's: the critic learns first
                metrics.update(self._worker("update_actor", batch, timing))
            if self.ahead is not None:  # the rollout's next batches take this step's weights (verl's timer name)
                metrics.update(self.ahead.sync_weights(self.global_step))
            with self._phase("dump_rollout_generations", timing):  # verl's timer name
                prompts = batch.batch["prompts"], batch.batch["prompt_attention_mask"]
                self.generations.training_step(batch, prompts, reward_extras, self.global_step)
        metrics.update(compute_data_metrics(batch.batch, use_critic=self.plan.use_critic))
        metrics.update(rollout_probs_diff(batch.batch))
        metrics.update(compute_timing_metrics(batch.batch, timing))
        metrics.update(compute_throughput_metrics(batch.batch, timing, self.plan.n_workers))
        metrics["training/global_step"] = self.global_step
        return {k: float(v) for k, v in metrics.items()}

    # ------------------------------------------------------------------ phases
    def _sample(
        self, batch: DataProto, timing: dict[str, float], more: Iterator[DataProto] | None = None
    ) -> tuple[DataProto, dict[str, list], dict]:
        """A batch of prompts through generation and reward: (its n responses a prompt, the reward function's
        per-row extras, the phases' metrics). In trainer.v1's async modes (``self.ahead``) ``batch`` is asked for,
        and the oldest batch asked for (drawing more from ``more`` at first) comes back generated instead."""
        metrics: dict[str, Any] = {}
        prepare = functools.partial(self._prepare, timing=timing)
        if self.ahead is None:
            batch = prepare(batch)
        with self._phase("gen", timing):
            if self.ahead is None:
                metrics.update(self._call("gen", batch))
            else:
                batch, generated = self.ahead.next(batch, more, self.global_step, prepare)
                metrics.update(generated)
        metrics.update(multi_turn_metrics(batch.non_tensor_batch))
        if self.plan.runs("balance"):
            with self._phase("balance", timing):
                metrics.update(self._balance(batch))
        with self._phase("reward", timing):
            reward_extras = self._reward(batch, metrics)
        return batch, reward_extras, metrics

    def _prepare(self, batch: DataProto, timing: dict[str, float]) -> DataProto:
        """A drawn batch ready to generate from: its prompts' ids and the token of its worker calls, ReMax's greedy
        baseline, rollout.n rows a prompt (interleaved), and the prompts as given (verl's "prompts", for the dumps:
        the rollout rewrites input_ids and attention_mask)."""
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        batch.meta_info[STEP_TOKEN] = uuid.uuid4().hex  # what the workers keep for this batch is under it
        if self.plan.runs("gen_max"):  # ReMax's baseline: the greedy answer's reward
            with self._phase("gen_max", timing):
                batch.batch["reward_baselines"] = self._greedy_reward(batch)
        batch = batch.repeat(self.config.actor_rollout_ref.rollout.n, interleave=True)
        batch.batch["prompts"], batch.batch["prompt_attention_mask"] = (
            batch.batch["input_ids"],
            batch.batch["attention_mask"],
        )
        return batch

    def _balance(self, batch: DataProto, extras: dict[str, list] | None = None) -> dict[str, float]:
        """``trainer.balance_batch``: reorder the rows (and the per-row ``extras``) so each worker's share gets a
        similar number of tokens; whole prompt groups with the prefix grouper. Its metrics."""
        keep_groups = self.config.actor_rollout_ref.actor.use_prefix_grouper
        return balance_batch(batch, self.plan.n_workers, keep_groups, extras)

    @contextmanager
    def _phase(self, name: str, timing: dict[str, float]) -> Iterator[None]:
        """``timed(name, timing)`` under the hang watchdog's deadline for the phase."""
        with self.watchdog.phase(name), timed(name, timing):
            yield

    def _worker(self, phase: str, batch: DataProto, timing: dict[str, float]) -> dict[str, float]:
        """Worker ``phase`` of the step, timed, when the plan runs it; its metrics."""
        if not self.plan.runs(phase):
            return {}
        with self._phase(phase, timing):
            return self._call(phase, batch)

    def _role_group(self, role: str) -> Any:
        """The worker group that computes ``role``'s phases (``config.worker_roles.ROLES``): read at each call, so
        that a group set on the trainer (verl's ``trainer.actor_rollout_wg = ...``) is the one called."""
        attribute = {"actor": "actor_rollout_wg"}.get(role, f"{role}_wg")
        return getattr(self, attribute)

    def _call(
        self, phase: str, batch: DataProto, flow: str = STEP_FLOW, meta_info: dict | None = None
    ) -> dict[str, float]:
        """Worker ``phase`` of ``flow`` on ``batch``: its entry's method on its role's workers, moving what its
        route says (trainer/routing.py); returns the phase's metrics."""
        entry, route = PHASES[phase], self.plan.flows[flow].route(phase)
        method = getattr(self._role_group(entry.role), entry.method)
        out = method(request(batch, batch.meta_info[STEP_TOKEN], route, meta_info))
        metrics = reduce_metrics(out.meta_info.pop("metrics", {}))
        take_back(batch, route, out)
        return metrics

    def _reward(self, batch: DataProto, metrics: dict) -> dict[str, list]:
        """Token-level scores into ``batch``: the reward function's, plus the reward model's on the last response
        token (and their group statistics into ``metrics``); returns the reward function's per-row extra values."""
        scores, reward_extras = self.reward_fn(batch)
        if getattr(self.reward_fn, "last_errors", 0):  # responses the user's function failed on, scored 0
            metrics["reward/errors"] = self.reward_fn.last_errors
        if self.plan.runs("rm_score"):  # timed within the reward, as verl does
            self._call("rm_score", batch)
            scores = scores + batch.batch["rm_scores"]
        batch.batch["token_level_scores"] = scores
        metrics.update(reward_group_metrics(scores.sum(-1), batch.non_tensor_batch["uid"]))
        return reward_extras

    def _greedy_reward(self, batch: DataProto) -> torch.Tensor:
        """(B,) reward of each prompt's greedy response (``rollout.val_kwargs`` sampling)."""
        greedy = self.config.actor_rollout_ref.rollout.val_kwargs.sampling()
        prompts = batch.select(batch_keys=self.plan.flows[GREEDY_FLOW].route("gen").send)  # every non-tensor too
        self._call("gen", prompts, GREEDY_FLOW, meta_info=greedy)
        return self.reward_fn(prompts)[0].sum(-1)

    # ------------------------------------------------------------------ validation
    def validate(self) -> dict[str, float]:
        """Greedy (``rollout.val_kwargs``) rewards on the validation set, per data source; the dumps of them."""
        val_kwargs = self.config.actor_rollout_ref.rollout.val_kwargs
        tally = ValidationTally(val_kwargs.n)
        for batch_dict in self.val_dataloader:
            batch = DataProto.from_single_dict(batch_dict, meta_info={STEP_TOKEN: uuid.uuid4().hex})
            batch = batch.repeat(val_kwargs.n, interleave=True)
            prompts = batch.batch["input_ids"], batch.batch["attention_mask"]
            with self.watchdog.phase("validate"):  # the user's reward function may hang as well
                self._call("gen", batch, VALIDATION_FLOW, val_kwargs.sampling())
                tally.add(batch, prompts, *self.val_reward_fn(batch))
        self.generations.validation(tally.parts, self.global_step, getattr(self, "logger", None))
        return tally.metrics()


def _due(freq: int, step: int, last_step: bool) -> bool:
    """verl's rule for test_freq/save_freq: every ``freq`` steps and at the last one; never when ``freq <= 0``."""
    return freq > 0 and (last_step or step % freq == 0)
