"""verl's run-level machinery ColoRL has its own way of doing: Ray's start-up, the trainer's v1 modes, the
transfer queue, skipping rollouts from a dump. Loaded with verl's defaults; ``cli.inert`` says what ColoRL does
with each key, ``trainer.running.run`` reads ``ray_kwargs``, ``planner.trainer_modes`` reads ``trainer.v1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from config.checks import optional_positive_int
from config.tree import InertTree


class RuntimeEnvTree(InertTree):
    """Ray's ``runtime_env`` (free-form: ``+ray_kwargs.ray_init.runtime_env.env_vars.X=1``)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"py_executable": None}
    OPEN: ClassVar[bool] = True


@dataclass(frozen=True)
class RayInitConfig:
    """``ray_kwargs.ray_init``: arguments of ``ray.init`` (ColoRL's older top-level ``ray_init`` is an alias)."""

    num_cpus: int | None = None  # null -> n_workers + 1 on CPU, Ray's own count on GPU
    runtime_env: RuntimeEnvTree = field(default_factory=RuntimeEnvTree.default)
    address: str | None = None  # ColoRL: null -> start a local cluster (or join RAY_ADDRESS when set)
    include_dashboard: bool = False  # ColoRL: a cluster the driver starts runs Ray's dashboard only when asked to

    def __post_init__(self) -> None:
        optional_positive_int(self, "num_cpus")


@dataclass(frozen=True)
class RayKwargsConfig:
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    timeline_json_file: str | None = None


class TrainerV1Tree(InertTree):
    """verl's trainer modes, read by ``planner.trainer_modes`` (the keys it does not honour: ``cli.inert``)."""

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


class TransferQueueTree(InertTree):
    """verl's distributed data store between the driver and the workers; ColoRL's is the per-worker step store."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "enable": False,
        "metrics": {"enabled": False, "port": 0},
        "backend": {
            "storage_backend": "SimpleStorage",
            "SimpleStorage": {"total_storage_size": 100000, "num_data_storage_units": 8},
            "MooncakeStore": {
                "auto_init": False,
                "metadata_server": "localhost:50123",
                "master_server_address": "localhost:50124",
                "local_hostname": "localhost",
                "protocol": "tcp",
                "global_segment_size": 4294967296,
                "local_buffer_size": 1073741824,
                "device_name": "",
            },
        },
    }


_SKIP = {"enable": False, "dump_dir": "~/.verl/rollout_dump", "steps": [], "action": "cache"}


class SkipTree(InertTree):
    """verl's rollout dumps replayed instead of generating (a debugging aid): not in ColoRL."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.utils.skip.SkipManagerConfig",
        "rollout": _SKIP,
        "rollout_tq": _SKIP,
        "async_rollout": _SKIP,
    }
