"""A deadline per driver phase: a hang becomes a report and a non-zero exit instead of a silent stall.

``with watchdog.phase("gen"): ...`` arms a deadline (``deadlines.get("gen", default_s)`` seconds) that a
background thread watches. When one passes, the thread prints which phase stalled, the driver's own stack
and ``dump_fn()`` (the ranks still busy and their Python stacks), runs ``teardown_fn`` (bounded), then
ends the process and its children with ``EXIT_HUNG`` (``exit_now``). Checkpoints are committed atomically,
so the last one stays loadable.

A person in the debugger is not a hang: while the main thread is traced (pdb, from ``breakpoint()`` in the driver
or, with ``trainer.use_ray=false``, in a worker's code) a passed deadline waits, and the phase gets its whole limit
again once the debugger lets go.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

import psutil

EXIT_HUNG = 3  # the process exit status after a phase passed its deadline
TEARDOWN_WAIT_S = 15.0  # a teardown that itself hangs must not keep the process alive
DEBUGGER_POLL_S = 1.0  # how often a deadline passed under the debugger looks again


class PhaseWatchdog:
    """Ends the process when a phase outlives its deadline. ``default_s=None`` leaves unlisted phases unwatched."""

    def __init__(
        self,
        deadlines: dict[str, float],
        default_s: float | None,
        dump_fn: Callable[[], str],
        teardown_fn: Callable[[], None] | None = None,
        exit_fn: Callable[[int], None] | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.deadlines = dict(deadlines)
        self.default_s = default_s
        self.dump_fn = dump_fn
        self.teardown_fn = teardown_fn
        self.exit_fn = exit_fn or exit_now
        self.stream = stream
        self._active: list[list] = []  # [phase, deadline on the monotonic clock, limit] (the debugger moves it)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._main_thread_id = threading.main_thread().ident

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Watch the block as phase ``name``; phases may nest (each keeps its own deadline)."""
        limit = self.deadlines.get(name, self.default_s)
        if limit is None:
            yield
            return
        entry = [name, time.monotonic() + limit, limit]
        with self._cond:
            self._active.append(entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="colorl-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._active.remove(entry)
                self._cond.notify()

    def _watch(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                expired = [entry for entry in self._active if entry[1] <= now]
                if expired and not in_debugger(self._main_thread_id):
                    break
                if expired:  # in the debugger: look again soon, and restart each phase's clock meanwhile
                    for entry in self._active:
                        entry[1] = now + entry[2]
                    self._cond.wait(DEBUGGER_POLL_S)
                    continue
                next_deadline = min((entry[1] for entry in self._active), default=None)
                self._cond.wait(None if next_deadline is None else next_deadline - now)
        self._expire(expired[-1])  # the innermost expired phase says the most

    def _expire(self, entry: list) -> None:
        name, _, limit = entry
        out = self.stream or sys.stderr
        print(
            f"colorl: hang: phase {name!r} passed its {limit:g} s deadline (trainer.phase_timeout_s); "
            "dumping stacks and exiting",
            file=out,
            flush=True,
        )
        try:
            report = self.dump_fn()
        except Exception as exc:  # the exit below matters more than a complete report
            report = f"(could not collect the workers' state: {type(exc).__name__}: {exc})"
        print(f"{report}\n--- driver (main thread) ---\n{self._driver_stack()}", file=out, flush=True)
        if self.teardown_fn is not None:
            teardown = threading.Thread(target=self.teardown_fn, daemon=True)
            teardown.start()
            teardown.join(TEARDOWN_WAIT_S)
        print(
            f"colorl: hang: phase {name!r} stalled; exiting with status {EXIT_HUNG}. The last checkpoint is "
            "intact: rerun with trainer.resume_mode=auto to continue from it.",
            file=out,
            flush=True,
        )
        self.exit_fn(EXIT_HUNG)

    def _driver_stack(self) -> str:
        frame = sys._current_frames().get(self._main_thread_id)
        return "".join(traceback.format_stack(frame)).rstrip() if frame is not None else "(main thread gone)"


def in_debugger(thread_id: int | None) -> bool:
    """Whether thread ``thread_id`` runs under a tracer (pdb sets ``f_trace`` on the frames it steps through)."""
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        if frame.f_trace is not None:
            return True
        frame = frame.f_back
    return False


def exit_now(status: int, grace_s: float = 5.0) -> None:
    """End this process at once, from any thread, and every process it started.

    ``os._exit``, because the main thread may be blocked in C code (``ray.wait``) that no exception reaches;
    it skips Ray's own shutdown, so the descendants (a local Ray cluster this process started) are ended
    here: SIGTERM, then SIGKILL for those still alive after ``grace_s``.
    """
    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for child in alive:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    os._exit(status)
