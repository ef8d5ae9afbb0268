"""Running a built trainer: start or join Ray, fit with restarts after a dead worker, and (for the command line)
turn each failure a user can act on into one line on stderr and an exit status (docs/reliability.md)."""

from __future__ import annotations

import importlib.util
import os
import socket
import sys

from config import ConfigError, PPOConfig, replace_keys
from data.reward import RewardError
from planner import StepPlan, make_plan, num_workers
from single_controller.errors import WorkerDiedError
from trainer.observing.health import NonFiniteLossError
from trainer.running import console
from trainer.running.build import build_trainer
from trainer.running.dynamic_sampling import DynamicSamplingError
from trainer.running.faults import FaultError
from trainer.running.groups import uses_ray
from trainer.running.preemption import EXIT_PREEMPTED, Preempted, signals_left_to_driver
from trainer.running.restarts import fit_with_restarts
from trainer.state.checkpoint import CheckpointError

EXIT_FAILED = 1  # a dead worker, a worker's exception, NaN losses, a checkpoint or reward failure, too few groups


def run_ppo(cfg: PPOConfig, plan: StepPlan | None = None) -> dict[str, float]:
    """Train from a typed config (``load_config``'s, or Hydra's through ``to_config``) and its step plan; returns
    the last step's metrics. A restart after a dead worker resumes from this run's own latest checkpoint
    (resume_mode=auto). With ``trainer.use_ray`` false (or null and Ray not installed) the one worker runs in this
    process and Ray is not imported (trainer.running.groups)."""
    plan = plan or make_plan(cfg, num_workers(cfg))
    cfg = replace_keys(cfg, {"trainer.use_ray": uses_ray(cfg, plan)})  # refused in one line before any model loads
    trainer = build_trainer(cfg, plan)
    started_ray = cfg.trainer.use_ray and _init_ray(
        trainer.config, trainer.plan.n_workers + trainer.plan.mode.rollout_workers
    )
    resuming = replace_keys(cfg, {"trainer.resume_mode": "auto"})
    try:
        return fit_with_restarts(trainer, lambda: build_trainer(resuming, trainer.plan), cfg.trainer.max_restarts)
    finally:
        if started_ray:
            import ray

            ray.shutdown()


def run_command_line(cfg: PPOConfig, plan: StepPlan) -> int:
    """``run_ppo`` for ``python main.py``: 0 when the run finished, else one line on stderr and the exit status.
    A ``ConfigError`` (a model or data path found wrong while building) is the caller's to report."""
    try:
        run_ppo(cfg, plan)
    # the run is over and the workers are torn down: say what went wrong, not where the driver was
    except (WorkerDiedError, FaultError, NonFiniteLossError, CheckpointError, RewardError, DynamicSamplingError) as exc:
        print(f"colorl: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except Preempted as exc:  # SIGTERM/SIGINT: the step was finished and checkpointed
        print(f"colorl: {exc}", file=sys.stderr)
        return EXIT_PREEMPTED
    return 0


def _init_ray(cfg: PPOConfig, n_workers: int) -> bool:
    """Start a local Ray cluster, or join ray_kwargs.ray_init.address / RAY_ADDRESS; False when Ray was already
    running."""
    import ray  # a Ray run's alone: a run without Ray never imports it

    if ray.is_initialized():  # the caller (a test, a notebook) owns Ray and will shut it down
        return False
    ray_init = cfg.ray_kwargs.ray_init
    address = ray_init.address or os.environ.get("RAY_ADDRESS")
    if address:
        _join_ray(address, "ray_kwargs.ray_init.address" if ray_init.address else "RAY_ADDRESS")
    else:
        # On CPU every worker (the rollout group's too) holds one CPU slot, plus one for the driver's tasks; Ray counts
        # the cores on GPU.
        cpu_default = n_workers + 1 if cfg.trainer.device == "cpu" else None
        dashboard = ray_init.include_dashboard  # off unless asked for: anyone who reaches it can run code
        if dashboard and importlib.util.find_spec("aiohttp") is None:  # what ray[default] adds to the minimal ray
            raise ConfigError.invalid(
                "ray_kwargs.ray_init.include_dashboard",
                dashboard,
                f"Ray's dashboard needs ray[default]: pip install 'ray[default]=={ray.__version__}'",
            )
        with signals_left_to_driver():  # SIGTERM/SIGINT to the process group: the driver saves, then stops Ray
            ray.init(
                num_cpus=ray_init.num_cpus or cpu_default,
                include_dashboard=dashboard,
                **console.quiet_ray_init_kwargs(),
            )
    return True


def _join_ray(address: str, key: str) -> None:
    """Attach to the running cluster at ``address``, failing in seconds with what to check."""
    import ray

    host, _, port = address.rpartition(":")
    if "://" not in address and port.isdigit():  # Ray itself retries an address where nothing listens for minutes
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as exc:
            raise ConfigError(
                f"{key}={address!r}: no Ray cluster answers there ({exc}); start one with "
                "`ray start --head` or fix the address"
            ) from None
    try:
        ray.init(address=address)  # an existing cluster brings its own resources
    except (ConnectionError, RuntimeError) as exc:
        raise ConfigError(
            f"{key}={address!r}: cannot join that Ray cluster ({str(exc).splitlines()[0]}). Clusters started by "
            "`ray start` check a token: set RAY_AUTH_MODE=token, with the head's ~/.ray/auth_token (or RAY_AUTH_TOKEN)"
        ) from None
