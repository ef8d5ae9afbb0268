"""Generation ahead of training: ``trainer.v1.trainer_mode`` = ``separate_async`` or ``colocate_async``.

The step's phases are the synchronous step's; only the generation moves. A batch drawn at step k is asked for at
once (and at the first step ``lookahead`` more), and step k trains on the oldest batch asked for (the
``trainer.replay_buffer`` queue): its generation ran while earlier steps trained.

- ``separate_async``: the rollout is a worker group of its own (``actor_rollout_ref.rollout.nnodes ×
  n_gpus_per_node`` workers, its own resource pool). After each step the trainer's group puts the actor's weights
  into Ray's object store one FSDP unit at a time and the rollout group takes them (``workers.roles.weight_sync``),
  without the driver waiting: the rollout's worker runs the calls in order, so a batch asked for after the sync is
  generated with those weights, one asked for before it with the previous ones.
- ``colocate_async``: the same queue on the training group; its workers run the generation and the phases in turn.

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

from config.phases import STEP_FLOW
from config.plan import StepPlan
from config.schema import PPOConfig
from single_controller import DataProto
from single_controller.ray import RayResourcePool, RayWorkerGroup
from trainer.metrics import reduce_metrics
from trainer.placement import rollout_class
from trainer.replay_buffer import VERSION, Generation, ReplayBuffer, eviction_metrics, staleness_metrics
from trainer.routing import STEP_TOKEN, request, take_back
from workers.runtime import malloc

SEED_STRIDE = 7919  # batch i of a run generates under trainer.seed + i × SEED_STRIDE (+ the rank)


@dataclasses.dataclass
class Asked:
    """A batch asked for: the driver's copy of it, and the generation call under way (None once taken back)."""

    batch: DataProto
    call: Any
    sync: Any = None  # the weight sync started before it, answered before its generation is read
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)


class Ahead:
    """The queue of batches generated ahead of training and, with ``separate_async``, the rollout group."""

    def __init__(self, cfg: PPOConfig, plan: StepPlan, trainer_group: Any, rollout_group: Any) -> None:
        self.cfg, self.plan = cfg, plan
        self.trainer_group, self.rollout_group = trainer_group, rollout_group
        self.separate = plan.mode.separate
        self.buffer = ReplayBuffer(plan.mode)
        self.version = 0  # steps trained into the weights the rollout generates with
        self.asked = 0  # batches asked for so far (each one's seed)
        self.sync: Any = None  # the last weight sync started and not yet answered

    @classmethod
    def start(cls, cfg: PPOConfig, plan: StepPlan, actor_group: Any, total_steps: int) -> Ahead:
        """The queue over ``actor_group`` (colocate_async), or over a rollout group started here (separate_async)."""
        if not plan.mode.separate:
            return cls(cfg, plan, actor_group, actor_group)
        rollout = cfg.actor_rollout_ref.rollout
        pool = RayResourcePool(
            [rollout.n_gpus_per_node] * rollout.nnodes, use_gpu=cfg.trainer.device == "cuda", max_colocate_count=1
        )
        workers = plan.mode.rollout_workers
        rows = cfg.data.train_batch_size * rollout.n // workers
        rollout_plan = dataclasses.replace(plan, n_workers=workers, gen_rows=rows)
        group = RayWorkerGroup(
            pool,
            rollout_class(cfg, rollout_plan),
            name_prefix=f"rollout{uuid.uuid4().hex[:4]}",
            worker_env=malloc.worker_env(cfg.trainer.device),
        )
        group.init_model(total_steps, seed=cfg.trainer.seed, deterministic=cfg.trainer.deterministic)
        return cls(cfg, plan, actor_group, group)

    # ------------------------------------------------------------------ the step's side
    def begin(self, step: int) -> None:
        """Before the first step (or the first after a resume): the rollout group takes the trainer's weights."""
        self.version = step
        self.sync_weights(step)

    def next(self, batch: DataProto, more: Iterator[DataProto], step: int, prepare: Callable) -> tuple[DataProto, dict]:
        """Ask for ``batch`` (and as many more from ``more`` as the look-ahead wants), then the oldest batch step
        ``step`` may train on, generated, with its samples' versions; the metrics of its generation and staleness.
        ``prepare`` gives a drawn batch its ids and its rollout.n repeats (``RayPPOTrainer._prepare``)."""
        self._ask(prepare(batch), step)
        while self.buffer.wanted():
            self._ask(prepare(next(more)), step)
        dropped: list[Generation] = []
        while True:  # drop: each evicted batch is replaced by a fresh one (verl's "evict k; refill k")
            taken, evicted = self.buffer.take(step)
            dropped += evicted
            for _ in evicted:
                self._ask(prepare(next(more)), step)
            if taken is not None:
                break
        batch = self._answered(taken.result)
        versions = np.full(len(batch), taken.version, dtype=np.int64)
        batch.non_tensor_batch[VERSION] = versions
        metrics = {**taken.result.metrics, **staleness_metrics(step, versions)}
        return batch, {**metrics, **eviction_metrics(step, dropped, self.cfg.data.train_batch_size)}

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
    def state(self) -> dict[str, Any]:
        """The queued batches (waited for: tensors, columns, versions) and the counters, as plain types."""
        queued = []
        for generation in self.buffer.queue:
            batch = self._answered(generation.result)
            queued.append(
                {
                    "asked_at": generation.asked_at,
                    "version": generation.version,
                    "tensors": dict(batch.batch.items()),
                    "columns": {k: list(v) for k, v in batch.non_tensor_batch.items()},
                    "token": batch.meta_info[STEP_TOKEN],
                    "metrics": generation.result.metrics,
                }
            )
        return {"asked": self.asked, "queued": queued}

    def load(self, state: dict[str, Any]) -> None:
        self.asked = state["asked"]
        for item in state["queued"]:
            columns = {k: np.array(v, dtype=object) for k, v in item["columns"].items()}
            batch = DataProto.from_dict(item["tensors"], columns, meta_info={STEP_TOKEN: item["token"]})
            self.buffer.add(Generation(item["asked_at"], item["version"], Asked(batch, None, metrics=item["metrics"])))

    # ------------------------------------------------------------------ internals
    def _ask(self, batch: DataProto, step: int) -> None:
        route = self.plan.flows[STEP_FLOW].route("gen")
        seed = {"seed": self.cfg.trainer.seed + self.asked * SEED_STRIDE}
        call = self.rollout_group.generate_sequences.start(
            request(batch, batch.meta_info[STEP_TOKEN], route, meta_info=seed)
        )
        self.asked += 1
        self.buffer.add(Generation(step, self.version, Asked(batch, call, self.sync)))

    def _answered(self, asked: Asked) -> DataProto:
        """``asked``'s batch with what its generation wrote (waiting for it once)."""
        if asked.call is not None:
            if asked.sync is not None:
                asked.sync.result()
            out = asked.call.result()
            asked.metrics = reduce_metrics(out.meta_info.pop("metrics", {}))
            take_back(asked.batch, self.plan.flows[STEP_FLOW].route("gen"), out)
            asked.call = asked.sync = None
        return asked.batch
