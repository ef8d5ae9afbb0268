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
    """The trainer modes, kept as given and read by ``planner.trainer_modes`` (the command-line adapter warns about
    the keys it does not honour, ``config.adapter``)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "trainer_mode": "sync",
        "sync": {},
        "colocate_async": {"num_warmup_batches": 1},
        "separate_async": {
            "num_warmup_batches": 1,
            "parameter_sync_step": 4,
            "hybrid_rollout": {
                "_target_": "verl.trainer.config.HybridRolloutSwitchConfig",
                "enable_switch": False,
                "switch_threshold_ratio": 0.4,
                "adaptive_switch_threshold": True,
                "switch_threshold_step_up": 0.05,
                "switch_threshold_step_down": 0.03,
                "switch_threshold_release_steps": 2,
                "switch_cost_window_size": 3,
            },
        },
        "sampler": {
            "max_off_policy_threshold": 8,
            "max_off_policy_strategy": "drop",
            "sync_refill_failed_groups": False,
            "custom_sampler": {"path": None, "name": None},
            "sampler_kwargs": {},
        },
    }
