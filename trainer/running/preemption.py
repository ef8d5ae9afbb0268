"""Preemption: SIGTERM (a cluster scheduler, ``ray job stop``) or SIGINT (Ctrl-C) ends a run with a checkpoint.

``stop = StopSignals(grace_s, ending).install()`` turns the first SIGTERM or SIGINT into a request,
``stop.signal``, until ``stop.restore()``: the driver finishes the step in progress (its phases are worker calls
that cannot be cut short without losing the step), writes a checkpoint, flushes its loggers and raises
:class:`Preempted`, which ``trainer.running.run`` turns into exit status ``EXIT_PREEMPTED``.
``trainer.resume_mode=auto`` (the default) then continues from that step.

A step that cannot finish in time is abandoned: ``grace_s`` (``trainer.stop_grace_s``) after the first signal the
process is gone, with the run's last word (``ending.last_word``) and one line naming the previous checkpoint, and
the same exit status. A second SIGINT stops at once: one line, exit status ``EXIT_SECOND_INTERRUPT``. Both are
done by a thread of this module's, not by the main thread, which may be the one stuck (in a worker method with
``trainer.use_ray=false``, in C code no Python signal handler reaches): Python's C-level handler writes each
signal's number to a socket (``signal.set_wakeup_fd``) whatever the main thread is doing, and the thread reads it.
Ending the process (``watchdog.exit_now``) leaves the previous checkpoint loadable: a commit is a series of
renames, each whole or not done (trainer.state.checkpoint), so it is the crash that commit is made to survive.

Ctrl-C, Slurm's ``scancel``/``KillWait`` and ``systemd stop`` signal a whole process group or cgroup, not just the
driver. The local Ray cluster the driver starts (GCS, raylet and, through the raylet, every worker) is started
inside :func:`signals_left_to_driver`, so it ignores them: stopping is left to the driver, which finishes the
step and saves it with its workers alive.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from trainer.running.watchdog import exit_now

EXIT_PREEMPTED = 4  # the exit status after a SIGTERM/SIGINT stop: the step's checkpoint, or (abandoned) the previous
EXIT_SECOND_INTERRUPT = 130  # a second Ctrl-C: the shell's status for a process ended by SIGINT (128 + 2)
SIGNALS = (signal.SIGTERM, signal.SIGINT)
ABANDON_S = 5.0  # of the grace period, kept for abandoning: the last word, the workers' and children's teardown
AT_ONCE_S = 2.0  # how long a second Ctrl-C leaves the teardown


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


@dataclass(frozen=True)
class Ending:
    """What ending a run from the signal thread needs from its trainer (each called from that thread)."""

    last_checkpoint: Callable[[], Path | None]  # the latest committed checkpoint
    last_word: Callable[[str], str]  # the run's summary (console.last_word), given why it ended
    teardown: Callable[[], None]  # stop the workers (a Ray group's actors), bounded by the caller


class StopSignals:
    """Records the first SIGTERM/SIGINT while active, abandons the step ``grace_s`` (None: never) after it and
    stops at once on a second SIGINT (main thread only: elsewhere it does nothing)."""

    def __init__(self, grace_s: float | None = None, ending: Ending | None = None) -> None:
        self.signal: signal.Signals | None = None
        self.grace_s = grace_s
        self.ending = ending
        self._previous: dict[int, Any] = {}
        self._previous_fd = -1
        self._writer: socket.socket | None = None
        self._lock = threading.Lock()
        self._finished = self._ending_now = False

    def install(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():  # Python's handlers are the main thread's
            return self
        reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)  # set_wakeup_fd's condition: a signal handler never blocks on it
        self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(reader,), name="colorl-stop-signals", daemon=True).start()
        return self

    def restore(self) -> None:
        """Put back the handlers that were there before :meth:`install`; from here the run ends on its own (an
        abandon already under way ends the process: this waits for it)."""
        with self._lock:
            self._finished = True
            ending = self._ending_now
        if ending:
            threading.Event().wait()  # the signal thread calls os._exit
        if self._writer is None:
            return
        signal.set_wakeup_fd(self._previous_fd)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        self._writer.close()  # the signal thread reads the end of its socket and returns
        self._writer = None

    def preempted(self, step: int, checkpoint: Any) -> Preempted:
        """The error that ends a run stopped by ``self.signal`` after ``step`` was checkpointed at ``checkpoint``."""
        return Preempted(
            f"stopped by {self.signal.name} after step {step}; its checkpoint is {checkpoint}. Rerun the same command "
            "(trainer.resume_mode=auto) to continue from it"
        )

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        """Python's handler, run by the main thread when it can: the signal thread does the work (it got the
        signal's number through the wakeup socket), so that a stuck main thread holds nothing up."""

    def _watch(self, reader: socket.socket) -> None:
        deadline = None
        with reader:
            while True:
                # never 0: a timeout of 0 makes recv non-blocking (BlockingIOError), not timed
                reader.settimeout(None if deadline is None else max(deadline - time.monotonic(), 1e-3))
                try:
                    received = reader.recv(64)
                except TimeoutError:
                    return self._abandon()
                if not received:  # restore() closed the other end
                    return None
                for signum in received:
                    if signum not in SIGNALS:
                        continue  # another handler's signal
                    if self.signal is None:
                        self.signal = signal.Signals(signum)
                        deadline = self._first(time.monotonic())
                    elif signum == signal.SIGINT:
                        return self._at_once()

    def _first(self, now: float) -> float | None:
        """Say what the first signal does; the moment to start abandoning the step (None: never)."""
        grace = self.grace_s
        within = f"; a step not done within {grace:g} s (trainer.stop_grace_s) is abandoned" if grace else ""
        print(
            f"colorl: received {self.signal.name}: finishing the current step, then saving a checkpoint and "
            f"exiting{within} (Ctrl-C again to stop at once)",
            file=sys.stderr,
            flush=True,
        )
        return None if grace is None else now + grace - min(ABANDON_S, grace / 2)  # the rest: for exiting

    def _abandon(self) -> None:
        grace = self.grace_s
        reserve = min(ABANDON_S, grace / 2)
        self._end(
            f"the step in progress was abandoned, not done {grace - reserve:g} s after {self.signal.name} "
            f"(trainer.stop_grace_s={grace:g}, less {reserve:g} s to exit)",
            EXIT_PREEMPTED,
            time.monotonic() + reserve,
        )

    def _at_once(self) -> None:
        self._end(None, EXIT_SECOND_INTERRUPT, time.monotonic() + AT_ONCE_S)

    def _end(self, why: str | None, status: int, deadline: float) -> None:
        """End the process by ``deadline`` with ``status``: the last word (when ``why``), the workers torn down,
        one line. Nothing once ``restore`` has run: the main thread is ending the run itself."""
        with self._lock:
            if self._finished:
                return
            self._ending_now = True
        try:
            checkpoint = self.ending.last_checkpoint() if self.ending else None
            if why is not None and self.ending is not None:
                _try(lambda: print(self.ending.last_word(why), flush=True))
            if self.ending is not None:  # a Ray group's actors; a cluster this process started goes in exit_now
                teardown = threading.Thread(target=self.ending.teardown, daemon=True)
                teardown.start()
                teardown.join(max((deadline - time.monotonic()) / 3, 0.0))
            print(_last_line(why, self.signal, checkpoint), file=sys.stderr, flush=True)
            # half of what is left: the local Ray cluster's processes ignore SIGTERM (signals_left_to_driver), so
            # they take the whole wait before their SIGKILL, and the process still has to end after that
            exit_now(status, grace_s=max((deadline - time.monotonic()) / 2, 0.1))
        finally:
            os._exit(status)  # whatever failed above, the process ends


def _last_line(why: str | None, sig: signal.Signals | None, checkpoint: Path | None) -> str:
    """The line an abandoned step (``why``) or a second Ctrl-C (``why`` None) ends the run with."""
    stopped = f"stopped by {sig.name}: {why}" if why is not None else "stopped at once by a second Ctrl-C"
    if checkpoint is None:
        return f"colorl: {stopped}; there is no checkpoint yet to continue from"
    return (
        f"colorl: {stopped}; the last checkpoint is {checkpoint}. Rerun the same command "
        "(trainer.resume_mode=auto) to continue from it"
    )


def _try(say: Callable[[], None]) -> None:
    """``say()``, unless it fails: ending the process matters more than a complete summary."""
    try:
        say()
    except Exception as exc:
        print(f"(could not print the run's summary: {type(exc).__name__}: {exc})", file=sys.stderr, flush=True)
