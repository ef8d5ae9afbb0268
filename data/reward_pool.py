"""A user's reward function, called in a small pool of killable processes, each call within a deadline.

A synchronous function that blocks forever cannot be interrupted in the thread that called it; in a process of
its own it can. ``UserFunction`` is what ``reward.custom_reward_function`` loads: called like the function, it
runs it in one of at most ``processes`` persistent worker processes (started as they are needed, each loading
the user's file once). A call that has not answered after ``timeout`` seconds raises ``CallTimeout``: its worker is
killed and reaped, and the next call that needs a worker starts a fresh one. Nothing grows per hang: no thread
waits on a hung call (the caller waits on the worker's pipe with a deadline), and a killed worker's process is
gone. A call that raises raises ``CallRaised`` with the function's exception type and message.

``map`` makes a batch's calls in one round trip per worker: the worker gets the list at once, answers each call
as it finishes, and each answer has ``timeout`` seconds from the one before it. A call that hangs ends its worker;
the calls after it go to a fresh one. So a batch of quick calls costs one message each way, not one per call.

Each worker runs this file as a script (standard library only: it starts in well under a second, whatever the
trainer imports), reads a length-prefixed pickled list of ``(args, kwargs)`` from one pipe and writes the pickled
``(ok, value)`` of each to another; the user's prints still go to the run's stdout. A worker whose parent died exits.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import importlib.util
import json
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

_HEADER = struct.Struct("!Q")  # each message: its length, then the pickle


class CallTimeout(TimeoutError):
    """The function did not answer within the deadline (its worker was killed)."""


class CallRaised(Exception):
    """The function raised; the message is ``TypeName: message`` of what it raised (in its worker)."""


class UserFunction:
    """Function ``name`` of the Python file at ``path``, each call made in the pool and bounded by ``timeout``
    seconds (``reward.timeout``), in at most ``processes`` worker processes. ``local()`` is the function itself,
    in this process (what a worker calls)."""

    def __init__(self, path: str, name: str, timeout: float = 300.0, processes: int = 1) -> None:
        self.path, self.name, self.timeout, self.processes = os.path.abspath(path), name, timeout, processes
        self.__name__ = name

    def bounded(self, timeout: float, processes: int) -> UserFunction:
        """The same function under another deadline and pool size."""
        return UserFunction(self.path, self.name, timeout, processes)

    def local(self) -> Any:
        return _load(self.path, self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _pool(self.path, self.name, self.processes).call(args, kwargs, self.timeout)

    def map(self, calls: list[dict[str, Any]]) -> list[Any]:
        """The function's value for each keyword-argument dict of ``calls``, in order, each within the deadline; a
        call that raised or timed out gives its ``CallRaised``/``CallTimeout`` in its place."""
        return _pool(self.path, self.name, self.processes).map(calls, self.timeout)

    def __reduce__(self) -> tuple:  # pickled (Ray actors, a checkpoint's config) as its file and name
        return UserFunction, (self.path, self.name, self.timeout, self.processes)

    def __repr__(self) -> str:
        return f"{self.name} of {self.path}"


@functools.cache
def _load(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"colorl_user_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


class _Worker:
    """One worker process and its two pipes (to it, from it)."""

    def __init__(self, path: str, name: str) -> None:
        to_child, self.to_worker = os.pipe()
        self.from_worker, from_child = os.pipe()
        argv = [sys.executable, os.path.abspath(__file__), path, name, str(to_child), str(from_child)]
        env = {**os.environ, "COLORL_REWARD_SYS_PATH": json.dumps(sys.path)}
        self.process = subprocess.Popen(argv, pass_fds=(to_child, from_child), env=env, stdin=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)

    def answers(self, calls: list[tuple[tuple, dict]], timeout: float) -> Iterator[tuple[bool, Any]]:
        """Each call's ``(ok, value)`` as the worker answers it (``ok`` False: the error line); ``TimeoutError`` when
        an answer takes more than ``timeout`` seconds after the one before it."""
        _write(self.to_worker, pickle.dumps(calls))
        for _ in calls:
            yield pickle.loads(_read(self.from_worker, time.monotonic() + timeout))

    def kill(self) -> None:
        """End the process and reap it; close the pipes (nothing of it is left)."""
        self.process.kill()
        self.process.wait()
        for fd in (self.to_worker, self.from_worker):
            os.close(fd)


class _Pool:
    """At most ``size`` workers of one function; a call takes an idle worker (or starts one, or waits for one)."""

    def __init__(self, path: str, name: str, size: int) -> None:
        self.path, self.name, self.size = path, name, size
        self.idle: list[_Worker] = []
        self.slots = threading.BoundedSemaphore(size)  # calls at a time = workers alive at most
        self.lock = threading.Lock()
        atexit.register(self.close)

    def call(self, args: tuple, kwargs: dict, timeout: float) -> Any:
        """The function's value for ``args``/``kwargs``; raises ``CallTimeout`` or ``CallRaised``."""
        value = self._map_one([(args, kwargs)], timeout)[0]
        if isinstance(value, Exception):
            raise value
        return value

    def map(self, calls: list[dict[str, Any]], timeout: float) -> list[Any]:
        """``calls`` in contiguous shares, one worker each (as many as the pool allows), in order of ``calls``."""
        share = -(-len(calls) // self.size) if calls else 1
        pairs = [((), kwargs) for kwargs in calls]
        chunks = [pairs[i : i + share] for i in range(0, len(pairs), share)]
        if len(chunks) <= 1:
            return self._map_one(pairs, timeout) if pairs else []
        with concurrent.futures.ThreadPoolExecutor(len(chunks)) as threads:  # each waits on its worker's pipe
            return [value for chunk in threads.map(lambda c: self._map_one(c, timeout), chunks) for value in chunk]

    def _map_one(self, calls: list[tuple[tuple, dict]], timeout: float) -> list[Any]:
        """``calls`` on one worker; after a call that hangs (its worker killed) the rest go to a fresh worker."""
        values: list[Any] = []
        while len(values) < len(calls):
            with self.slots:
                worker = self._take()
                try:
                    for ok, value in worker.answers(calls[len(values) :], timeout):
                        values.append(value if ok else CallRaised(value))
                except BaseException as exc:  # timed out, died or interrupted: the worker may be anywhere
                    worker.kill()
                    if not isinstance(exc, (TimeoutError, EOFError)):
                        raise
                    timed_out = isinstance(exc, TimeoutError)
                    status = worker.process.returncode
                    why = f"no answer after {timeout}s" if timed_out else f"WorkerExit: its process ended ({status})"
                    values.append(CallTimeout(why) if timed_out else CallRaised(why))
                    continue
                self._put(worker)
        return values

    def _take(self) -> _Worker:
        with self.lock:
            worker = self.idle.pop() if self.idle else None
        return worker or _Worker(self.path, self.name)

    def _put(self, worker: _Worker) -> None:
        with self.lock:
            self.idle.append(worker)

    def close(self) -> None:
        with self.lock:
            workers, self.idle = self.idle, []
        for worker in workers:
            worker.kill()


@functools.cache
def _pool(path: str, name: str, size: int) -> _Pool:
    """One pool per function and size in a process (training's and validation's managers share it)."""
    return _Pool(path, name, size)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read(fd: int, deadline: float | None = None) -> bytes:
    """One message from ``fd``; ``TimeoutError`` past ``deadline`` (monotonic), ``EOFError`` when the writer ended."""
    header = _read_exactly(fd, _HEADER.size, deadline)
    return _read_exactly(fd, _HEADER.unpack(header)[0], deadline)


def _read_exactly(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None and not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _serve(path: str, name: str, read_fd: int, write_fd: int) -> None:
    """A worker: load the function, then answer calls until the trainer closes the pipe or dies."""
    parent = os.getppid()

    def orphaned() -> None:  # a hung call must not outlive a trainer killed with SIGKILL
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=orphaned, daemon=True).start()
    function = None
    while True:
        try:
            calls = pickle.loads(_read(read_fd))
        except EOFError:
            return
        for args, kwargs in calls:  # each answered as soon as it is computed
            try:
                function = function or _load(path, name)
                answer = pickle.dumps((True, function(*args, **kwargs)))
            except Exception as exc:
                answer = pickle.dumps((False, f"{type(exc).__name__}: {exc}"))
            _write(write_fd, answer)


if __name__ == "__main__":
    sys.path[:] = json.loads(os.environ.pop("COLORL_REWARD_SYS_PATH", "[]")) or sys.path
    _serve(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
