"""The run's start-up: Ray's (``ray_kwargs.ray_init``, read by ``trainer.running.run``) and the trainer modes
(``trainer.v1``, read and checked by ``planner.trainer_modes``: sync, generation ahead of training, a rollout group
of its own), each key with its default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from config.checks import optional_positive_int
from config.tree import InertTree


@dataclass(frozen=True)
class RayInitConfig:
    """``ray_kwargs.ray_init``: arguments of ``ray.init`` (ColoRL's older top-level ``ray_init`` is an alias)."""

    num_cpus: int | None = None  # null -> n_workers + 1 on CPU, Ray's own count on GPU
    address: str | None = None  # ColoRL: null -> start a local cluster (or join RAY_ADDRESS when set)
    include_dashboard: bool = False  # ColoRL: a cluster the driver starts runs Ray's dashboard only when asked to

    def __post_init__(self) -> None:
        optional_positive_int(self, "num_cpus")


@dataclass(frozen=True)
class RayKwargsConfig:
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)


class TrainerV1Tree(InertTree):
    """The trainer modes, kept as given and read by ``planner.trainer_modes``: ``trainer_mode`` (sync, or generation
    ahead of training), each mode's look-ahead, the rollout group's updates per weight sync, and how old a batch
    may train (``sampler``)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "trainer_mode": "sync",
        "sync": {},
        "colocate_async": {"num_warmup_batches": 1},
        "separate_async": {"num_warmup_batches": 1, "parameter_sync_step": 4},
        "sampler": {"max_off_policy_threshold": 8, "max_off_policy_strategy": "drop"},
    }
