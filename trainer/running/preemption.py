"""Preemption: SIGTERM (a cluster scheduler, ``ray job stop``) or SIGINT (Ctrl-C) ends a run with a checkpoint.

``stop = StopSignals().install()`` turns the first SIGTERM or SIGINT into a request, ``stop.signal``, until
``stop.restore()``: the driver
finishes the step in progress (its phases are worker calls that cannot be cut short without losing the step),
writes a checkpoint, flushes its loggers and raises :class:`Preempted`, which ``trainer.running.run`` turns into exit
status ``EXIT_PREEMPTED``. ``trainer.resume_mode=auto`` (the default) then continues from that step. A second SIGINT
stops at once (KeyboardInterrupt), for a user who will not wait for the step to finish.

Ctrl-C, Slurm's ``scancel``/``KillWait`` and ``systemd stop`` signal a whole process group or cgroup, not just the
driver. The local Ray cluster the driver starts (GCS, raylet and, through the raylet, every worker) is started
inside :func:`signals_left_to_driver`, so it ignores them: stopping is left to the driver, which finishes the
step and saves it with its workers alive.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

EXIT_PREEMPTED = 4  # the process exit status after a SIGTERM/SIGINT stop with its checkpoint written
SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def signals_left_to_driver() -> Iterator[None]:
    """Processes started inside the block start with SIGTERM and SIGINT blocked: a blocked signal mask is inherited
    across fork and exec (Ray blocks SIGINT in its own processes the same way), so they never see a signal sent to
    the group; this process, unblocked again after the block, gets it. ``ray.shutdown`` stops them with SIGKILL
    after its SIGTERM goes unanswered."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Preempted(Exception):
    """The run stopped on a signal, at a step boundary, after checkpointing that step."""


class StopSignals:
    """Records the first SIGTERM/SIGINT while active (main thread only: elsewhere it records nothing)."""

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # Python delivers signals to the main thread
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def restore(self) -> None:
        """Put back the handlers that were there before :meth:`install`."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum)
        print(
            f"colorl: received {self.signal.name}: finishing the current step, then saving a checkpoint and "
            "exiting (Ctrl-C again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def preempted(self, step: int, checkpoint: Any) -> Preempted:
        """The error that ends a run stopped by ``self.signal`` after ``step`` was checkpointed at ``checkpoint``."""
        return Preempted(
            f"stopped by {self.signal.name} after step {step}; its checkpoint is {checkpoint}. Rerun the same command "
            "(trainer.resume_mode=auto) to continue from it"
        )
