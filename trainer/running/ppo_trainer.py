"""The PPO driver: one process that writes the RL dataflow as plain calls on worker groups.

Every model lives in the workers: one ``WorkerDict`` process per device holds the actor (+ rollout), the reference
policy, the critic and distillation's teachers (colocation: ``trainer.running.placement``). The driver calls them phase
by phase and computes rewards and advantages, which are cheap tensor maths over the whole batch. ``train_step``
(``trainer.running.step``) runs the plan's phases of the table ``planner.phases.STEP_PHASES`` in its order, one timed
line each; a worker phase's role and method come from its entry. Tensors stay where they are next read: each call sends
only what the driver holds of what the phase reads, and takes back only what a driver phase reads (the routes of
``planner.phases.declare_flows``); the rest stays in the workers' step store. The trainer holds the step
(``self.step``, a ``trainer.running.step.TrainStep`` built with what its phases use) and places, loops, validates and
checkpoints around it.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import algos
from config.schema import PPOConfig
from planner.phases import VALIDATION_FLOW
from planner.plan import StepPlan
from planner.worker_roles import ROLE, ROLES, WorkerRole
from single_controller.data_proto import DataProto
from trainer.asynchronous.ahead import Ahead, node_workers
from trainer.observing.generations import GenerationLog
from trainer.observing.health import HealthMonitor, NonFiniteGuard, NonFiniteLossError
from trainer.observing.metrics import timed
from trainer.observing.report import RunReport
from trainer.observing.tracking import Tracking
from trainer.running import console, groups
from trainer.running.placement import placed_roles, role_classes
from trainer.running.preemption import Ending, StopSignals
from trainer.running.step import STEP_TOKEN, RewardFn, TrainStep
from trainer.running.validation import ValidationTally
from trainer.running.watchdog import PhaseWatchdog
from trainer.state.checkpoint import CheckpointError, CheckpointManager, load_driver_state
from trainer.state.data_position import DataPosition
from trainer.state.fingerprint import config_record
from trainer.state.ledger import Ledger
from trainer.state.run_dir import open_run
from workers.runtime import malloc


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
        self.val_reward_fn = val_reward_fn
        self.plan = plan  # which phases run, which keys travel, per-rank batch sizes (planner.plan)
        kl_ctrl = config.algorithm.kl_ctrl
        self.kl_ctrl_in_reward = algos.get_kl_controller(
            kl_ctrl.type, kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon
        )
        steps_per_epoch = len(train_dataloader)
        self.total_training_steps = config.trainer.total_training_steps or steps_per_epoch * config.trainer.total_epochs
        self.global_step = 0
        self.data = DataPosition(train_dataloader)  # saved with checkpoints: a resumed run draws the same batches
        self.ledger = Ledger(config.trainer.default_local_dir, self.data.epoch_size())  # what each step trained
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
            dump_fn=lambda: groups.stall_report(self.worker_groups()),
            teardown_fn=lambda: [groups.shutdown(group) for group in self.worker_groups()],
        )
        actor_rollout_ref = config.actor_rollout_ref
        self.step = TrainStep(  # one PPO iteration: the plan's phases (trainer.running.step)
            plan,
            actor_rollout_ref.rollout,
            config.algorithm,
            train_batch_size=config.data.train_batch_size,
            critic_warmup=config.trainer.critic_warmup,
            keep_groups=actor_rollout_ref.actor.use_prefix_grouper,
            groups=self._role_group,
            reward_fn=reward_fn,
            kl_ctrl=self.kl_ctrl_in_reward,
            generations=self.generations,
            watchdog=self.watchdog,
            ledger=self.ledger,
        )

    @property
    def reward_fn(self) -> RewardFn:
        """The training reward (the step's: setting it here sets the one the step calls)."""
        return self.step.reward_fn

    @reward_fn.setter
    def reward_fn(self, reward_fn: RewardFn) -> None:
        self.step.reward_fn = reward_fn

    @property
    def ahead(self) -> Ahead | None:
        """trainer.v1's async modes: the batches generated ahead (trainer.asynchronous.ahead); None until
        ``init_workers`` starts the rollout group, and in the synchronous mode."""
        return self.step.ahead

    @ahead.setter
    def ahead(self, ahead: Ahead | None) -> None:
        self.step.ahead = ahead

    def _role_group(self, role: str) -> Any:
        """The worker group that computes ``role``'s phases (``planner.worker_roles.ROLES``): read at each call, so
        that a group set on the trainer (``trainer.actor_rollout_wg = ...``) is the one called."""
        return getattr(self, ROLE[role].group)

    def train_step(self, batch: DataProto, more: Iterator[DataProto] | None = None) -> dict[str, float]:
        """One PPO iteration at ``global_step`` (``TrainStep.run``); its metrics."""
        return self.step.run(batch, more, self.global_step)

    # ------------------------------------------------------------------ placement
    def init_workers(self) -> None:
        """Start one WorkerDict per device holding every role (Ray's, or trainer.use_ray=false: one in this
        process, trainer.running.groups), then build the models (the rollout's last)."""
        cfg, plan = self.config, self.plan
        trainer = cfg.trainer
        roles = role_classes(cfg, plan)  # the role workers of one process (trainer.running.placement)
        # on a CPU, mimalloc's malloc in every worker: glibc's fragments under a training step
        # (workers/runtime/malloc.py)
        worker_env = {**malloc.worker_env(trainer.device, node_workers(cfg, plan)), **console.worker_env()}
        self.fused_wg = groups.start_fused_group(cfg, roles, worker_env)
        where = ", ".join(
            f"rank {rank} pid {p['pid']} on {p['node_ip']} (node {p['node_id'][:8]})"
            for rank, p in enumerate(self.fused_wg.processes)
        )
        print(f"[colorl] workers: {where}", flush=True)
        views = self.fused_wg.spawn(prefix_set=roles.keys())
        for role in ROLES:  # a role without a worker of its own runs its phases on the one it shares
            view = views.get(role.worker)
            setattr(self, role.group, views[ROLE[role.shares].worker] if view is None and role.shares else view)
        # the rollout engine sizes its cache by the memory the other models leave: its role loads last
        placed = sorted(placed_roles(cfg, plan), key=lambda role: role.rollout)
        with self.watchdog.phase("init_model"):  # loading a model from a shared file system can hang too
            for role in placed:
                views[role.worker].init_model(
                    self.total_training_steps, seed=trainer.seed, deterministic=trainer.deterministic
                )
            if plan.mode.asynchronous:  # separate_async: the rollout group starts here
                pad = self.tokenizer.pad_token_id
                pad = self.tokenizer.eos_token_id if pad is None else pad  # the rollout's padding of responses
                self.ahead = Ahead.start(cfg, plan, self.actor_rollout_wg, self.total_training_steps, pad)

    def worker_groups(self) -> list[Any]:
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
        start = time.monotonic()  # trainer.max_wall_time_s counts from here
        self.logger = self._tracking(start)
        self.wandb_run_id = self.logger.wandb_run_id
        # <default_local_dir>/report.html, at each validation and the end; with the ledger's lines
        self.report = RunReport(self.config, ledger=self.ledger.summary)
        # SIGTERM/SIGINT: save, then stop; a step not done within trainer.stop_grace_s is abandoned
        last, stop = {}, StopSignals(cfg.stop_grace_s, self._ending(start)).install()
        out_of_time = False
        try:
            if self.val_dataloader is not None and cfg.val_before_train and not resumed:
                last = self.validate()
                self.logger.log(self.health.observe(last, self.global_step), step=self.global_step)
                self.report.write(self.logger.records(), self.health.fired)
            batches = self.ledger.watch(self.data.batches())  # each batch drawn, in the ledger
            while self.global_step < self.total_training_steps and not cfg.val_only:  # val_only: validate, stop
                self.global_step += 1
                last = self.train_step(next(batches), batches)
                self.ledger.end_step(self.global_step)  # on disk before the step's checkpoint
                last["training/epoch"] = float(self.data.epoch)
                self.nonfinite.check(last, self.global_step, self.checkpoints.latest())
                # with dynamic sampling and no total_training_steps, a run also ends once it has drawn total_epochs
                # passes over the data (the DAPO recipe's end), which may come before the step count
                used_up = self.plan.dynamic_sampling and self.data.epochs_drawn() >= cfg.total_epochs
                done = self.global_step >= self.total_training_steps or (used_up and cfg.total_training_steps is None)
                out_of_time = cfg.max_wall_time_s is not None and time.monotonic() - start > cfg.max_wall_time_s
                last_step = done or out_of_time  # validate and save at the last step when the freq > 0
                validated = self.val_dataloader is not None and _due(cfg.test_freq, self.global_step, last_step)
                timing: dict[str, float] = {}
                if validated:
                    with timed("testing", timing):
                        last.update(self.validate())
                preempted = stop.signal is not None  # read once: a signal after the save waits for the next step
                if preempted or _due(cfg.save_freq, self.global_step, last_step):  # preempted: save to resume
                    with self.watchdog.phase("save_checkpoint"), timed("save_checkpoint", timing):
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
            report = self.report.write(self.logger.records(), self.health.fired)
            if isinstance(sys.exc_info()[1], NonFiniteLossError):  # the NaN guard: its last word, then its line
                print(self._last_word(False, False, time.monotonic() - start, report, nan_stop=True), flush=True)
        preempted = stop.signal is not None and self.global_step < self.total_training_steps
        print(self._last_word(preempted, out_of_time, time.monotonic() - start, report), flush=True)
        if preempted:
            raise stop.preempted(self.global_step, self.checkpoints.checkpoints()[-1])
        return last

    def _tracking(self, start: float) -> Tracking:
        """The run's loggers (``trainer.logger``), continuing the history of a resumed run."""
        cfg = self.config.trainer
        return Tracking(
            project_name=cfg.project_name,
            experiment_name=cfg.experiment_name,
            backends=list(cfg.logger),
            config=dataclasses.asdict(self.config),
            local_dir=cfg.default_local_dir,
            total_steps=self.total_training_steps,
            # the bar shows the budget that ends the run: the steps, or the wall time when that runs out first
            wall_budget_s=cfg.max_wall_time_s,
            started=start,
            resume_id=self.wandb_run_id,
            resume_step=self.global_step,  # steps logged after it are computed again: one history
        )

    def _ending(self, start: float) -> Ending:
        """What the signal thread ends the run with when the step in progress is abandoned (preemption.Ending)."""

        def word(why: str) -> str:
            report = self.report.write(self.logger.records(), self.health.fired)
            return self._last_word(False, False, time.monotonic() - start, report, abandoned=why)

        # a local group's worker is this process, which ends anyway; a Ray group's actors may live elsewhere
        teardown = self.watchdog.teardown_fn if self.config.trainer.use_ray else lambda: None
        return Ending(self.checkpoints.latest, word, teardown)

    def _last_word(
        self,
        preempted: bool,
        out_of_time: bool,
        wall_s: float,
        report: Path | None,
        nan_stop: bool = False,
        abandoned: str | None = None,
    ) -> str:
        """The run's summary (``trainer.running.console.last_word``): why it ended, what it reached, where it all is."""
        cfg = self.config.trainer
        records = self.logger.records()
        step = self.global_step
        if abandoned:  # the step in progress is not done: the steps done are those logged (after their save)
            why, step = abandoned, max((r["step"] for r in records), default=0)
        elif nan_stop:
            why = f"the NaN guard stopped it ({cfg.max_nonfinite_steps} steps in a row with NaN/inf losses)"
        elif preempted:
            why = "preempted (a stop signal): the step was finished and checkpointed"
        elif out_of_time:
            why = f"its wall-time budget ran out (trainer.max_wall_time_s={cfg.max_wall_time_s:g})"
        elif cfg.val_only:
            why = "validation only (trainer.val_only=true)"
        else:
            why = f"done: step {self.global_step} reached"
        paths = {
            "checkpoint": self.checkpoints.latest(),
            "report": report,
            "metrics": self.logger.metrics_path if self.logger.metrics_path.exists() else None,
            "ledger": self.ledger.path if self.ledger.path.exists() else None,
        }
        no_count = cfg.total_training_steps is None and cfg.max_wall_time_s  # a wall-time budget: no step count
        steps = None if no_count else self.total_training_steps
        argv = console.continue_argv(
            sys.argv[1:], self.global_step if why.startswith("done") else None, cfg.resume_mode
        )
        trained = self.ledger.summary()  # per epoch: trained N of M, filtered, dropped (trainer.state.ledger)
        return console.last_word(why, step, steps, wall_s, records, paths, cfg.default_local_dir, argv, trained)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Write the workers' and the driver's state for this step; the previous checkpoint stays intact on failure."""
        staging = self.checkpoints.staging_path(self.global_step)
        try:
            self.checkpoints.make_staging(staging)
            for role, group in self._trained_groups():
                group.save_checkpoint(str(staging / role.name))
            return self.checkpoints.commit(staging, self.global_step, self._driver_state())
        except OSError as exc:  # a worker's OSError reaches us as a RayTaskError that is also an OSError
            self.checkpoints.abandon(staging)
            previous = self.checkpoints.latest()
            raise CheckpointError(
                f"saving the checkpoint of step {self.global_step} failed ({getattr(exc, 'cause', exc)}); "
                f"the previous checkpoint is intact: {previous or 'none yet'}"
            ) from exc

    def _trained_groups(self) -> list[tuple[WorkerRole, Any]]:
        """The trained roles this run places, with their worker groups: what a checkpoint holds, by role name."""
        return [(role, getattr(self, role.group)) for role in ROLES if role.trained and getattr(self, role.group)]

    def _driver_state(self) -> dict[str, Any]:
        return {
            "global_step": self.global_step,
            **self.data.state(),
            "kl_ctrl": self.kl_ctrl_in_reward.state_dict(),
            "wandb_run_id": self.wandb_run_id,
            "config": config_record(self.config),  # compared on resume (trainer.state.fingerprint)
            "ledger": self.ledger.state(),  # the ledger's lines up to this step, checked on resume
            **({"ahead": self.ahead.state(self.step.generating())} if self.ahead is not None else {}),
        }

    def load_checkpoint(self) -> bool:
        """Load the checkpoint ``open_run`` picked (``trainer.resume_mode``); True when there was one."""
        path = self.resume_from
        if path is None:
            self._resume_ledger(None, None)  # a run that died before its first checkpoint left lines
            return False
        for role, _ in self._trained_groups():
            if not (path / role.name).exists():
                raise CheckpointError(
                    f"{path} has no {role.name}/ to resume the {role.name} from (saved by a run without one?)"
                )
        try:
            with self.watchdog.phase("load_checkpoint"):
                for role, group in self._trained_groups():
                    group.load_checkpoint(str(path / role.name))
        except (ValueError, FileNotFoundError) as exc:  # raised in a worker: a different model, missing files
            raise CheckpointError(f"cannot resume from {path}: {getattr(exc, 'cause', exc)}") from exc
        state = load_driver_state(path)
        self.global_step = state["global_step"]
        self.data.load(state)
        self.kl_ctrl_in_reward.load_state_dict(state["kl_ctrl"])
        self.wandb_run_id = state["wandb_run_id"]
        if self.ahead is not None:
            self.ahead.load(state["ahead"])
        self._resume_ledger(state.get("ledger"), path)
        print(f"[colorl] resumed from {path} (step {self.global_step})", flush=True)
        return True

    def _resume_ledger(self, state: dict[str, Any] | None, path: Path | None) -> None:
        """The ledger as of checkpoint ``path`` (None: a fresh start), checked against it (``Ledger.resume``)."""
        in_flight = self.ahead.in_flight() if self.ahead is not None else []
        drawn = self.data.epoch, self.data.drawn_in_epoch()
        self.ledger.resume(state, path, self.global_step, drawn, in_flight)

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
                self.step.generate(batch, VALIDATION_FLOW, val_kwargs.sampling())
                tally.add(batch, prompts, *self.val_reward_fn(batch))
                tally.count_errors(getattr(self.val_reward_fn, "last_error_reasons", {}))
        self.generations.validation(tally.parts, self.global_step, getattr(self, "logger", None))
        return tally.metrics()


def _due(freq: int, step: int, last_step: bool) -> bool:
    """The rule of test_freq/save_freq: every ``freq`` steps and at the last one; never when ``freq <= 0``."""
    return freq > 0 and (last_step or step % freq == 0)
