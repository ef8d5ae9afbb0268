"""Which kind of worker group a run places, and the few things the driver does to a group by kind.

``trainer.use_ray`` decides: true, a ``RayWorkerGroup`` (one Ray actor per worker); false, a ``LocalWorkerGroup``
(the one worker is an object of the driver's process: single_controller/local.py); null, Ray when it is installed,
else the local group for a config that fits one worker. Ray is imported by Ray runs alone, so a run without Ray
trains where Ray is not installed. A config the local group cannot run (more than one worker, a rollout group of
its own, generation ahead of training) is refused in one line before any model loads (``uses_ray``).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from config import ConfigError, PPOConfig
from planner import StepPlan
from single_controller.base.worker_group import ClassWithInitArgs
from trainer.running import console


def uses_ray(cfg: PPOConfig, plan: StepPlan) -> bool:
    """``trainer.use_ray`` resolved for ``plan``: whether the run places Ray workers; ``ConfigError`` when it
    says false (or Ray is missing) and the config needs what only Ray gives."""
    asked = cfg.trainer.use_ray
    if asked or (asked is None and _ray_installed()):
        return True
    why = "trainer.use_ray=false" if asked is False else "Ray is not installed (trainer.use_ray=null)"
    trainer = cfg.trainer
    if trainer.n_gpus_per_node * trainer.nnodes != 1:
        raise ConfigError(
            f"trainer.n_gpus_per_node={trainer.n_gpus_per_node} × trainer.nnodes={trainer.nnodes}: {why} runs one "
            "worker in the driver's process; set both to 1, or install Ray (pip install ray) and trainer.use_ray=true"
        )
    if plan.mode.asynchronous:
        raise ConfigError(
            f"trainer.v1.trainer_mode={plan.mode.mode}: {why} runs every phase in one process, in turn; use "
            "trainer.v1.trainer_mode=sync, or Ray (trainer.use_ray=true)"
        )
    return False


def start_fused_group(cfg: PPOConfig, roles: dict[str, ClassWithInitArgs], worker_env: dict[str, str]) -> Any:
    """The group of colocated ``roles`` (one ``WorkerDict`` per device): local when ``trainer.use_ray`` is false,
    else Ray's, on a pool of ``trainer.n_gpus_per_node × trainer.nnodes`` workers."""
    trainer = cfg.trainer
    if trainer.use_ray is False:
        from single_controller.local import LocalWorkerGroup, local_colocated_cls

        # the console's environment (no weight-loading bars); malloc's preload cannot apply to a running process
        return LocalWorkerGroup(local_colocated_cls(roles), trainer.device, console.worker_env())
    from single_controller.ray.colocate import create_colocated_worker_cls
    from single_controller.ray.group import RayWorkerGroup
    from single_controller.ray.placement import RayResourcePool

    pool = RayResourcePool(
        [trainer.n_gpus_per_node] * trainer.nnodes, use_gpu=trainer.device == "cuda", max_colocate_count=1
    )
    return RayWorkerGroup(pool, create_colocated_worker_cls(roles), worker_env=worker_env)


def stall_report(groups: list[Any]) -> str:
    """What the driver waits on and every worker's stacks (ray/health.py); a local group's worker is the driver,
    whose stack the watchdog prints itself."""
    ray_groups = [group for group in groups if not _is_local(group)]
    if not ray_groups:
        return "the worker runs in the driver's process (trainer.use_ray=false): its stack is the driver's"
    from single_controller.ray.health import stall_report as ray_stall_report

    return ray_stall_report([p for group in ray_groups for p in group.processes])


def shutdown(group: Any) -> None:
    """Tear ``group`` down: kill a Ray group's actors and free its placement groups, or drop a local worker."""
    if _is_local(group):
        group.shutdown()
        return
    from single_controller.ray.health import shutdown_worker_group

    shutdown_worker_group(group)


def _ray_installed() -> bool:
    try:
        return importlib.util.find_spec("ray") is not None
    except ImportError:  # an import hook that hides it
        return False


def _is_local(group: Any) -> bool:
    from single_controller.local import LocalWorkerGroup

    return isinstance(group, LocalWorkerGroup)
