"""One training step as the phase table: ``TrainStep.run`` runs the plan's phases of ``planner.phases.STEP_PHASES``
in the table's order, one timed line each.

A phase is either a worker phase, its entry's method on its role's worker group called with what its route moves
(``_call``, ``trainer.running.routing``), or a phase with driver code, found by its name in ``STEP_CODE``. The step is
data: a synchronous step runs the plan's list; dynamic sampling's ``filter_groups`` runs the prefix before it once per
generation batch; another order (an asynchronous mode's generation on one group and training on another) is another
list of the same names through ``run_phases``: with ``trainer.v1``'s async modes (``trainer.asynchronous.ahead``), the
phases before ``gen`` run on each batch as it is drawn and its generation is asked for; the ``gen`` phase of the step
takes back the oldest batch asked for, generated, and the phases after it run on that one.

A ``TrainStep`` is built with what its phases use (the config sections, the plan, the worker groups, the reward
function, the KL controller, the dumps, the watchdog, the ledger); the trainer holds one
(``trainer.running.ppo_trainer.RayPPOTrainer.step``) and runs it once per step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from config.schema import AlgorithmConfig
from config.sections.rollout import RolloutConfig
from data.reward import RewardHandle
from planner.dataflow import DRIVER
from planner.phases import GREEDY_FLOW, PHASES, STEP_FLOW
from planner.plan import StepPlan
from single_controller.base.worker_group import StartedCall
from single_controller.data_proto import DataProto
from trainer.asynchronous.ahead import Ahead, Generating
from trainer.asynchronous.replay_buffer import FIRST_VERSION, VERSION, staleness_metrics
from trainer.observing.generations import GenerationLog
from trainer.observing.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    multi_turn_metrics,
    reduce_metrics,
    reward_group_metrics,
    rollout_probs_diff,
    timed,
)
from trainer.running.advantage import compute_advantage
from trainer.running.balance import balance_batch
from trainer.running.dynamic_sampling import collect
from trainer.running.routing import STEP_TOKEN, request, take_back
from trainer.running.watchdog import PhaseWatchdog
from trainer.state.ledger import Ledger, prompts

RewardFn = Callable[[DataProto], tuple[torch.Tensor, dict]]


@dataclasses.dataclass
class StepState:
    """What a step's phases share on the driver: the batch (its rows change at the rollout and at the phases that
    select rows), the next generation batches (dynamic sampling), the step's number, the reward function's per-row
    extras, the metrics and the timings."""

    batch: DataProto
    more: Iterator[DataProto] | None = None
    step: int = 0  # the trainer's global_step: the weights' version, the dumps' file, critic_warmup's count
    timing: dict[str, float] = dataclasses.field(default_factory=dict)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    extras: dict[str, list] = dataclasses.field(default_factory=dict)
    scoring: RewardHandle | None = None  # the batch's rewards being computed (``reward``), until a phase reads them


class TrainStep:
    """The step of ``trainer.running.ppo_trainer.RayPPOTrainer``: its phases' driver code and worker calls, built
    with what they use. ``groups(role)`` is the worker group that computes a role's phases
    (``planner.worker_roles.ROLES``), looked up at each call: a group set on the trainer after the step is built is
    the one called. ``ahead`` is the batches generated ahead in ``trainer.v1``'s async modes (set once the rollout
    group starts). The ``ledger``, when there is one, gets what each step trained, filtered and dropped
    (``trainer.state.ledger``).

    ``phase_hook("before" | "after", phase, state)``, when set, is called around each phase (``trainer.replay``:
    the debugger before a phase, each phase's outputs for ``trainer.diff``)."""

    phase_hook: Callable[[str, str, StepState], None] | None = None
    ahead: Ahead | None = None

    def __init__(
        self,
        plan: StepPlan,
        rollout: RolloutConfig,
        algorithm: AlgorithmConfig,
        train_batch_size: int,
        critic_warmup: int,
        keep_groups: bool,
        groups: Callable[[str], Any],
        reward_fn: RewardFn,
        kl_ctrl: Any,
        generations: GenerationLog,
        watchdog: PhaseWatchdog,
        ledger: Ledger | None = None,
    ) -> None:
        self.plan = plan  # which phases run, what each call moves (planner.plan)
        self.rollout, self.algorithm = rollout, algorithm  # rollout.n and val_kwargs; the advantage, the filter
        self.train_batch_size, self.critic_warmup = train_batch_size, critic_warmup
        self.keep_groups = keep_groups  # the prefix grouper's: balancing moves a prompt's rows together
        self.groups, self.reward_fn, self.kl_ctrl = groups, reward_fn, kl_ctrl
        self.generations, self.watchdog, self.ledger = generations, watchdog, ledger

    def run(self, batch: DataProto, more: Iterator[DataProto] | None = None, step: int = 0) -> dict[str, float]:
        """Step ``step``, one PPO iteration on a batch of prompts: the plan's phases of ``planner.phases.STEP_PHASES``
        in the table's order (``run_phases``). With dynamic sampling (``trainer.running.dynamic_sampling``) ``batch``
        is the first generation batch and ``more`` gives the next ones: the ``filter_groups`` phase runs the table's
        prefix (the phases before it) on each."""
        state = StepState(batch, more, step)
        with timed("step", state.timing):
            self.run_phases(self.plan.step_phases, state)
        metrics, batch = state.metrics, state.batch
        self._record("trained", batch)
        metrics.update(compute_timing_metrics(batch.batch, state.timing))
        metrics.update(compute_throughput_metrics(batch.batch, state.timing, self.plan.n_workers))
        metrics["training/global_step"] = step
        return {k: float(v) for k, v in metrics.items()}

    def run_phases(self, names: tuple[str, ...], state: StepState) -> None:
        """The phases ``names`` (of the table, in the order given) on ``state``: each one's driver code from
        ``STEP_CODE``, or else its entry's worker method on its role's group, under the timer its entry names.

        The step is data: a synchronous step runs the plan's phases in the table's order; with dynamic sampling,
        ``filter_groups`` runs the prefix before it on each generation batch; an asynchronous mode runs the same
        entries split in two lists (generation on one group, the rest on another), each through this loop."""
        if "filter_groups" in names:  # the prefix runs inside the filter, once per generation batch
            names = names[names.index("filter_groups") :]
        for name in names:
            if state.scoring is not None and self._reads_scores(name):
                self._scored(state)
            code, timer = self.STEP_CODE.get(name), PHASES[name].timer
            if self.phase_hook is not None:
                self.phase_hook("before", name, state)
            with self._phase(timer, state.timing) if timer else contextlib.nullcontext():
                if code is not None:
                    code(self, state)
                else:
                    state.metrics.update(self._call(name, state.batch))
            if self.phase_hook is not None:
                self.phase_hook("after", name, state)
        if state.scoring is not None:  # the phases' caller reads the rewards (dynamic sampling's filter)
            self._scored(state)

    def _reads_scores(self, name: str) -> bool:
        """Whether phase ``name`` needs the rewards: a driver phase (it may read the per-row extras) or one that
        reads ``token_level_scores``; the worker phases before the advantage (old_log_prob, ref, teacher, values)
        run while the responses are scored."""
        phase = self.plan.flows[STEP_FLOW].phase(name)
        return phase.on == DRIVER or "token_level_scores" in phase.reads

    # ------------------------------------------------------------------ the driver's code of the phases
    def _prompts(self, state: StepState) -> None:
        """A prompt group's id, and the token under which the workers keep what they compute for this batch."""
        batch = state.batch
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        batch.meta_info[STEP_TOKEN] = uuid.uuid4().hex

    def _gen_max(self, state: StepState) -> None:
        """ReMax's baseline: the reward of each prompt's greedy response (``rollout.val_kwargs`` sampling)."""
        batch, greedy = state.batch, self.rollout.val_kwargs.sampling()
        prompts = batch.select(batch_keys=self.plan.flows[GREEDY_FLOW].route("gen").send)  # every non-tensor too
        self.generate(prompts, GREEDY_FLOW, meta_info=greedy)
        batch.batch["reward_baselines"] = self.reward_fn(prompts)[0].sum(-1)

    def _gen(self, state: StepState) -> None:
        """``rollout.n`` responses to each prompt (rows of a prompt next to each other). In trainer.v1's async modes
        this batch is asked for, and the oldest batch asked for comes back generated instead
        (``trainer.asynchronous.ahead``)."""
        batch = self._repeated(state.batch)
        if self.ahead is None:
            state.batch = batch
            state.metrics.update(self.generate(batch))
            return
        state.batch, generated = self.ahead.next(batch, state.more, state.step, self.generating())
        state.metrics.update({**generated, **multi_turn_metrics(state.batch.non_tensor_batch)})

    def generating(self) -> Generating:
        """How the batches generated ahead go through this step's phases (``trainer.asynchronous.ahead``)."""
        return Generating(
            prepare=self._drawn,
            start=lambda group, batch, meta_info: self._start("gen", batch, group=group, meta_info=meta_info),
            finish=lambda batch, call: self._finish("gen", batch, call),
            writes=self.plan.flows[STEP_FLOW].route("gen").writes,
            dropped=lambda batch: self._record("dropped", batch),
        )

    def _record(self, kind: str, batch: DataProto) -> None:
        """``batch``'s prompts as ``kind`` in the step's ledger lines (``trainer.state.ledger``), when there is one."""
        if self.ledger is not None:
            self.ledger.record(kind, batch)

    def _repeated(self, batch: DataProto) -> DataProto:
        batch = batch.repeat(self.rollout.n, interleave=True)
        # the prompts as given, for the dumps: the rollout rewrites input_ids and attention_mask
        batch.batch["prompts"], batch.batch["prompt_attention_mask"] = (
            batch.batch["input_ids"],
            batch.batch["attention_mask"],
        )
        return batch

    def _drawn(self, batch: DataProto) -> DataProto:
        """A batch drawn ahead (trainer.v1's async modes) through the plan's phases before ``gen``, repeated."""
        part = StepState(batch)
        self.run_phases(self.plan.step_phases[: self.plan.step_phases.index("gen")], part)
        return self._repeated(part.batch)

    def _handover(self, state: StepState) -> None:
        """A batch generated ahead reaches the training phases: the staleness of its samples."""
        columns = state.batch.non_tensor_batch
        state.metrics.update(staleness_metrics(state.step, columns[VERSION], columns.get(FIRST_VERSION)))

    def _update_weights(self, state: StepState) -> None:
        """The batches asked for from now on are generated with this step's weights (a rollout group takes them)."""
        state.metrics.update(self.ahead.sync_weights(state.step))

    def _balance_rows(self, state: StepState) -> None:
        state.metrics.update(self._balance(state.batch, state.extras or None))

    def _reward(self, state: StepState) -> None:
        """Start scoring the batch (``RewardManager.submit``); the scores land in it at the first phase that reads
        them (``_scored``), a concurrent manager's (``data.reward_loop``) computed meanwhile."""
        submit = getattr(self.reward_fn, "submit", None)  # a plain function: scored now
        batch = state.batch
        state.scoring = submit(batch) if submit is not None else RewardHandle(lambda: self.reward_fn(batch))

    def _scored(self, state: StepState) -> None:
        """Token-level scores into the batch: the reward function's, plus the reward model's on the last response
        token (``rm_score``, run before the reward), with their group statistics; keeps the function's per-row
        extras. The wait is timed on the reward's line (``timing_s/reward``: submitting plus waiting)."""
        batch, metrics = state.batch, state.metrics
        with self._phase("reward", state.timing):
            scores, state.extras = state.scoring.result()
        state.scoring = None
        failed = getattr(self.reward_fn, "last_error_rows", [])
        if failed:  # responses that scored 0 as the function failed on them: their prompts, in the ledger
            self._record("failed", batch[np.asarray(failed)])
        if getattr(self.reward_fn, "last_errors", 0):  # responses the user's function failed on, scored 0
            metrics["reward/errors"] = self.reward_fn.last_errors
            for reason, count in getattr(self.reward_fn, "last_error_reasons", {}).items():
                metrics[f"reward/errors/{reason}"] = count
        if "rm_scores" in batch.batch.keys():
            scores = scores + batch.batch["rm_scores"]
        batch.batch["token_level_scores"] = scores
        metrics.update(reward_group_metrics(scores.sum(-1), batch.non_tensor_batch["uid"]))

    def _filter_groups(self, state: StepState) -> None:
        """Generation batches through the table's prefix until the step's prompt groups are collected
        (``trainer.running.dynamic_sampling``); the collected rows get a new step token, and are balanced when asked."""
        prefix = self.plan.step_phases[: self.plan.step_phases.index("filter_groups")]

        generated: list[tuple[int, int]] = []  # the prompts of every generation batch, for the ledger

        def sample(batch: DataProto) -> tuple[DataProto, dict[str, list], dict[str, float]]:
            part = StepState(batch, step=state.step, timing=state.timing)
            self.run_phases(prefix, part)
            generated.extend(prompts(part.batch))
            return part.batch, part.extras, part.metrics

        batch, state.extras, sampled = collect(
            state.batch, state.more, sample, self.train_batch_size, self.rollout.n, self.algorithm.filter_groups
        )
        if self.ledger is not None:  # dropped without signal, or beyond the step's batch
            kept = set(prompts(batch))
            self.ledger.add("filtered", [prompt for prompt in generated if prompt not in kept])
        batch.meta_info[STEP_TOKEN] = uuid.uuid4().hex  # the workers keep the training phases' under it
        if self.plan.balance_batch:  # filter_groups balances the rows it keeps (the DAPO recipe's order)
            sampled.update(self._balance(batch, state.extras))
        state.batch = batch
        state.metrics.update(sampled)

    def _adv(self, state: StepState) -> None:
        compute_advantage(state.batch, self.algorithm, self.plan, self.kl_ctrl, state.metrics, state.extras)

    def _update_actor(self, state: StepState) -> None:
        if state.step >= self.critic_warmup:  # the critic learns first
            state.metrics.update(self._call("update_actor", state.batch))

    def _dump(self, state: StepState) -> None:
        """The generation dumps and the run report's samples."""
        batch = state.batch
        prompts = batch.batch["prompts"], batch.batch["prompt_attention_mask"]
        self.generations.training_step(batch, prompts, state.extras, state.step)

    def _data_metrics(self, state: StepState) -> None:
        state.metrics.update(compute_data_metrics(state.batch.batch, use_critic=self.plan.use_critic))
        state.metrics.update(rollout_probs_diff(state.batch.batch))

    # the driver's code of each phase that has some, by its name in planner.phases.STEP_PHASES; a worker phase
    # without an entry is its role's method, called with what its route moves (``_call``)
    STEP_CODE: dict[str, Callable[[TrainStep, StepState], None]] = {
        "prompts": _prompts,
        "gen_max": _gen_max,
        "gen": _gen,
        "handover": _handover,
        "balance": _balance_rows,
        "reward": _reward,
        "filter_groups": _filter_groups,
        "adv": _adv,
        "update_actor": _update_actor,
        "update_weights": _update_weights,
        "dump_rollout_generations": _dump,
        "metrics": _data_metrics,
    }

    # ------------------------------------------------------------------ worker calls
    def _balance(self, batch: DataProto, extras: dict[str, list] | None = None) -> dict[str, float]:
        """``trainer.balance_batch``: reorder the rows (and the per-row ``extras``) so each worker's share gets a
        similar number of tokens; whole prompt groups with the prefix grouper. Its metrics."""
        return balance_batch(batch, self.plan.n_workers, self.keep_groups, extras)

    @contextmanager
    def _phase(self, name: str, timing: dict[str, float]) -> Iterator[None]:
        """``timed(name, timing)`` under the hang watchdog's deadline for the phase."""
        with self.watchdog.phase(name), timed(name, timing):
            yield

    def _call(
        self, phase: str, batch: DataProto, flow: str = STEP_FLOW, meta_info: dict | None = None
    ) -> dict[str, float]:
        """Worker ``phase`` of ``flow`` on ``batch``: its entry's method on its role's workers, moving what its
        route says (trainer/running/routing.py); returns the phase's metrics."""
        return self._finish(phase, batch, self._start(phase, batch, flow, meta_info=meta_info), flow)

    def _start(
        self, phase: str, batch: DataProto, flow: str = STEP_FLOW, group: Any = None, meta_info: dict | None = None
    ) -> StartedCall:
        """Start worker ``phase`` of ``flow`` on ``batch`` (on ``group``, by default its role's), not waiting."""
        entry, route = PHASES[phase], self.plan.flows[flow].route(phase)
        method = getattr(group if group is not None else self.groups(entry.role), entry.method)
        sent = request(batch, batch.meta_info[STEP_TOKEN], route, meta_info)
        if not hasattr(method, "start"):  # a group set on the trainer with plain methods (a test's): call it now
            out = method(sent)
            return SimpleNamespace(result=lambda: out)
        return method.start(sent)

    def _finish(self, phase: str, batch: DataProto, call: StartedCall, flow: str = STEP_FLOW) -> dict[str, float]:
        """Wait for ``call`` of ``phase``, take what its route gives back into ``batch``; the phase's metrics."""
        out = call.result()
        metrics = reduce_metrics(out.meta_info.pop("metrics", {}))
        take_back(batch, self.plan.flows[flow].route(phase), out)
        return metrics

    def generate(self, batch: DataProto, flow: str = STEP_FLOW, meta_info: dict | None = None) -> dict[str, float]:
        """Responses to ``batch``'s prompts (its gen phase in ``flow``); the rollout's metrics, multi-turn's too."""
        metrics = self._call("gen", batch, flow, meta_info)
        return {**metrics, **multi_turn_metrics(batch.non_tensor_batch)}
