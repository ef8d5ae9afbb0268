"""Generation ahead of training: ``trainer.v1.trainer_mode`` = ``separate_async`` or ``colocate_async``.

The step's phases are the synchronous step's (``trainer.running.step``); only the generation moves. A batch drawn at
step k is asked for at once (and at the first step ``lookahead`` more), and step k trains on the oldest batch asked for
(the ``trainer.asynchronous.replay_buffer`` queue): its generation ran while earlier steps trained.

- ``separate_async``: the rollout is a worker group of its own (``actor_rollout_ref.rollout.nnodes ×
  n_gpus_per_node`` workers, its own resource pool). After each step the trainer's group puts the actor's weights
  into Ray's object store one FSDP unit at a time and the rollout group takes them (``workers.roles.weight_sync``),
  without the driver waiting: the rollout's worker runs the calls in order, so a batch asked for after the sync is
  generated with those weights, one asked for before it with the previous ones.
- ``colocate_async``: generation on the training group, its workers running it and the phases in turn: with the hf
  rollout, partial rollouts (``trainer.asynchronous.partial``: the step's generation stops once a batch of groups has
  ended, the rest goes on at the next step); otherwise the same queue as ``separate_async``.

A batch's samples carry the version of the weights that generated them (``replay_buffer.VERSION``: the number of
steps trained into them). Each batch is generated under its own seed, so checkpoints hold the batches still queued
(their tensors and versions) and a resumed run trains on exactly what the straight run would.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from config.schema import PPOConfig
from planner.plan import StepPlan, rollout_plan
from single_controller.data_proto import DataProto
from trainer.asynchronous.partial import Pool
from trainer.asynchronous.replay_buffer import VERSION, Generation, ReplayBuffer, eviction_metrics
from trainer.running import console
from trainer.running.placement import rollout_class
from trainer.running.routing import STEP_TOKEN
from workers.runtime import malloc

SEED_STRIDE = 7919  # batch i of a run generates under trainer.seed + i × SEED_STRIDE (+ the rank)


def node_workers(cfg: PPOConfig, plan: StepPlan) -> int | None:
    """The worker processes sharing a node's cores with a rollout group of its own (the trainer's and the
    rollout's per node), else None: each group's own count (``malloc.compute_threads``)."""
    if not plan.mode.separate:
        return None
    return cfg.trainer.n_gpus_per_node + cfg.actor_rollout_ref.rollout.n_gpus_per_node


@dataclasses.dataclass(frozen=True)
class Generating:
    """The step's side of a generation (``trainer.running.step``): ``prepare`` a drawn batch (the phases before ``gen``,
    the repeats), ``start`` its generation on a group with some meta_info, ``finish`` it into the batch (metrics);
    the keys the generation ``writes``; what to do with rows ``dropped`` as too stale (the run's ledger records
    them)."""

    prepare: Callable[[DataProto], DataProto]
    start: Callable[[Any, DataProto, dict], Any]
    finish: Callable[[DataProto, Any], dict[str, float]]
    writes: tuple[str, ...]
    dropped: Callable[[DataProto], None] = lambda batch: None


@dataclasses.dataclass
class Asked:
    """A batch asked for: the driver's copy of it, and the generation call under way (None once taken back)."""

    batch: DataProto
    call: Any
    sync: Any = None  # the weight sync started before it, answered before its generation is read
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)


class Ahead:
    """The queue of batches generated ahead of training and, with ``separate_async``, the rollout group."""

    def __init__(
        self, cfg: PPOConfig, plan: StepPlan, trainer_group: Any, rollout_group: Any, pad_token_id: int
    ) -> None:
        self.cfg, self.plan = cfg, plan
        self.trainer_group, self.rollout_group = trainer_group, rollout_group
        self.separate = plan.mode.separate
        self.buffer = ReplayBuffer(plan.mode)
        self.version = 0  # steps trained into the weights the rollout generates with
        self.asked = 0  # batches asked for so far (each one's seed)
        self.sync: Any = None  # the last weight sync started and not yet answered
        self.pool = Pool(cfg, plan.mode, trainer_group, pad_token_id) if plan.mode.partial else None

    @classmethod
    def start(cls, cfg: PPOConfig, plan: StepPlan, actor_group: Any, total_steps: int, pad_token_id: int) -> Ahead:
        """The queue over ``actor_group`` (colocate_async; its partial rollouts pad responses with
        ``pad_token_id``), or over a rollout group started here (separate_async)."""
        if not plan.mode.separate:
            return cls(cfg, plan, actor_group, actor_group, pad_token_id)
        from single_controller.ray.group import RayWorkerGroup  # a Ray run's alone (trainer.running.groups)
        from single_controller.ray.placement import RayResourcePool

        rollout = cfg.actor_rollout_ref.rollout
        pool = RayResourcePool(
            [rollout.n_gpus_per_node] * rollout.nnodes, use_gpu=cfg.trainer.device == "cuda", max_colocate_count=1
        )
        group = RayWorkerGroup(
            pool,
            rollout_class(cfg, rollout_plan(cfg, plan)),
            name_prefix=f"rollout{uuid.uuid4().hex[:4]}",
            worker_env={**malloc.worker_env(cfg.trainer.device, node_workers(cfg, plan)), **console.worker_env()},
        )
        group.init_model(total_steps, seed=cfg.trainer.seed, deterministic=cfg.trainer.deterministic)
        return cls(cfg, plan, actor_group, group, pad_token_id)

    # ------------------------------------------------------------------ the step's side
    def begin(self, step: int) -> None:
        """Before the first step (or the first after a resume): the rollout group takes the trainer's weights."""
        self.version = step
        self.sync_weights(step)

    def next(
        self, batch: DataProto, more: Iterator[DataProto], step: int, generating: Generating
    ) -> tuple[DataProto, dict]:
        """Ask for ``batch`` (ready to generate from; and for as many more drawn from ``more`` as the look-ahead
        wants), then give the oldest batch step ``step`` may train on, generated, each sample with its weights'
        version (``VERSION``); the metrics of its generation and of the batches evicted as too old."""
        if self.pool is not None:
            drawn = map(generating.prepare, more)
            return self.pool.next(batch, drawn, step, self.version, self._seed, generating)
        self._ask(batch, step, generating)
        while self.buffer.wanted():
            self._ask(generating.prepare(next(more)), step, generating)
        dropped: list[Generation] = []
        while True:  # drop: each evicted batch is replaced by a fresh one (evict k, refill k)
            taken, evicted = self.buffer.take(step)
            dropped += evicted
            for generation in evicted:
                generating.dropped(generation.result.batch)
                self._ask(generating.prepare(next(more)), step, generating)
            if taken is not None:
                break
        batch = self._answered(taken.result, generating)
        batch.non_tensor_batch[VERSION] = np.full(len(batch), taken.version, dtype=np.int64)
        return batch, {**taken.result.metrics, **eviction_metrics(step, dropped, self.cfg.data.train_batch_size)}

    def sync_weights(self, step: int) -> dict[str, float]:
        """After step ``step``'s update: the next batches asked for are generated with its weights. With a rollout
        group, the trainer's group puts them in the object store now and the rollout takes them in its turn."""
        self.version = step
        if not self.separate:
            return {}
        start = time.perf_counter()
        if self.sync is not None:  # the previous sync's answer (its errors too), long since given
            self.sync.result()
        units = self.trainer_group.export_weights()[0]
        self.sync = self.rollout_group.import_weights.start(tuple(units))
        return {"timing_s/update_weights": time.perf_counter() - start}

    # ------------------------------------------------------------------ checkpoints
    def in_flight(self) -> list[DataProto]:
        """The batches asked for and not yet trained on (the partial rollouts' rows): what a checkpoint holds."""
        batches = [generation.result.batch for generation in self.buffer.queue]
        return batches + ([self.pool.rows] if self.pool is not None and self.pool.rows is not None else [])

    def state(self, generating: Generating) -> dict[str, Any]:
        """The queued batches (waited for: tensors, columns, versions) or the partial rollouts' rows in flight, and
        the generations asked for, as plain types."""
        queued = []
        for generation in self.buffer.queue:
            batch = self._answered(generation.result, generating)
            queued.append(
                {
                    "asked_at": generation.asked_at,
                    "version": generation.version,
                    **_plain(batch),
                    "token": batch.meta_info[STEP_TOKEN],
                    "metrics": generation.result.metrics,
                }
            )
        pool = self.pool.rows if self.pool is not None else None
        return {"asked": self.asked, "queued": queued, "pool": None if pool is None else _plain(pool)}

    def load(self, state: dict[str, Any]) -> None:
        self.asked = state["asked"]
        if state.get("pool") is not None:
            self.pool.rows = _from_plain(state["pool"])
        for item in state["queued"]:
            batch = _from_plain(item, meta_info={STEP_TOKEN: item["token"]})
            self.buffer.add(Generation(item["asked_at"], item["version"], Asked(batch, None, metrics=item["metrics"])))

    # ------------------------------------------------------------------ internals
    def _seed(self) -> int:
        """The seed of the next generation asked for (its own, so a resumed run generates what the straight did)."""
        self.asked += 1
        return self.cfg.trainer.seed + (self.asked - 1) * SEED_STRIDE

    def _ask(self, batch: DataProto, step: int, generating: Generating) -> None:
        call = generating.start(self.rollout_group, batch, {"seed": self._seed()})
        self.buffer.add(Generation(step, self.version, Asked(batch, call, self.sync)))

    def _answered(self, asked: Asked, generating: Generating) -> DataProto:
        """``asked``'s batch with what its generation wrote (waiting for it once)."""
        if asked.call is not None:
            if asked.sync is not None:  # the weight sync before it: its errors surface here
                asked.sync.result()
            asked.metrics = generating.finish(asked.batch, asked.call)
            asked.call = asked.sync = None
        return asked.batch


def _plain(batch: DataProto) -> dict[str, Any]:
    """A batch's tensors and columns (as lists of plain values: numbers as Python's), for a checkpoint."""
    return {"tensors": dict(batch.batch.items()), "columns": {k: v.tolist() for k, v in batch.non_tensor_batch.items()}}


def _from_plain(plain: dict[str, Any], meta_info: dict | None = None) -> DataProto:
    columns = {k: np.array(v, dtype=object) for k, v in plain["columns"].items()}
    return DataProto.from_dict(plain["tensors"], columns, meta_info=meta_info)
