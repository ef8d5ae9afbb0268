"""Survive a dead worker inside one job: tear its group down, rebuild it, resume from the last checkpoint."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn

from single_controller.errors import WorkerDiedError
from trainer.running import groups
from trainer.running.faults import named, ray_error


def fit_with_restarts(trainer: Any, rebuild: Callable[[], Any], max_restarts: int) -> dict[str, float]:
    """``trainer.init_workers(); trainer.fit()``, restarted up to ``max_restarts`` times after a dead worker.

    A restart kills what is left of the worker group, then builds a fresh trainer with ``rebuild()`` (fresh
    driver state), whose config must say ``trainer.resume_mode=auto``: its ``fit`` then resumes from the run's
    latest complete checkpoint, so at most the steps since that checkpoint are computed again. However
    the run ends, the workers are killed before this returns or raises: no process outlives it. A Ray exception
    that ends the run is raised as the one line ``trainer.running.faults.named`` makes of it.
    """
    restarts = 0
    while True:
        try:
            trainer.init_workers()
            return trainer.fit()
        except WorkerDiedError as exc:
            if restarts >= max_restarts:
                _raise_named(exc)
            restarts += 1
            print(
                f"colorl: {exc}\ncolorl: restart {restarts} of {max_restarts} (trainer.max_restarts): rebuilding "
                "the workers and resuming from the last checkpoint",
                file=sys.stderr,
                flush=True,
            )
        except ray_error() as exc:  # a worker's exception, a full object store (a Ray run's)
            _raise_named(exc)
        finally:
            _shutdown_workers(trainer)
        trainer = rebuild()


def _raise_named(exc: BaseException) -> NoReturn:
    """Raise ``exc`` as the one line ``trainer.running.faults.named`` makes of it (itself when it has none)."""
    fault = named(exc)
    if fault is exc:
        raise exc
    raise fault from exc


def _shutdown_workers(trainer: Any) -> None:
    """Kill the trainer's groups placed so far (none when init_workers failed before placing one)."""
    for worker_group in trainer.worker_groups():
        groups.shutdown(worker_group)
