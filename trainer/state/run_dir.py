"""One run per directory: the lock on ``trainer.default_local_dir`` and the checkpoint the run continues from.

``open_run(config, checkpoints)`` is called while the trainer is built, before Ray or any model starts:

- it makes the directory (one that cannot be written is a config error) and takes its lock,
  ``<dir>/.colorl.lock``: an exclusive ``flock`` held until this process exits (the kernel releases it when the
  process dies, however it dies), with the holder's host, pid and start time written inside. A second driver is
  refused with the holder named; a lock file left with a holder inside by a process that ended without
  releasing it (killed, crashed) is taken over with a line that says so;
- it picks the checkpoint to continue from (``trainer.resume_mode``) and compares the config it was saved with
  (``trainer.state.fingerprint``).

The lock is re-entrant within a process: a restart (``trainer.running.restarts``) or a second run from the same notebook
builds its trainer again on the same directory.
"""

from __future__ import annotations

import atexit
import datetime
import fcntl
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import psutil

from config import ConfigError, PPOConfig
from trainer.state.checkpoint import CheckpointError, CheckpointManager, load_driver_state
from trainer.state.fingerprint import check_resume

LOCK = ".colorl.lock"
_held: dict[str, int] = {}  # real path of a run directory -> the fd holding its lock, for this process's lifetime


class RunLockError(CheckpointError):
    """``trainer.default_local_dir`` is in use by another live run."""


def open_run(config: PPOConfig, checkpoints: CheckpointManager) -> Path | None:
    """Lock the run directory, then the checkpoint to resume from (None: a fresh start), its config checked."""
    trainer = config.trainer
    lock_run_dir(trainer.default_local_dir)
    path = checkpoints.find(trainer.resume_mode, trainer.resume_from_path)
    if path is not None:
        for line in check_resume(load_driver_state(path).get("config"), config, path):
            print(f"colorl: {line}", file=sys.stderr, flush=True)
    return path


def lock_run_dir(path: str) -> None:
    """Hold ``path``'s run lock until this process exits (see the module's docstring)."""
    root = Path(path)
    key = os.path.realpath(root)
    if key in _held:
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError.invalid(
            "trainer.default_local_dir",
            path,
            f"cannot write there ({type(exc).__name__}: "
            f"{exc.strerror or exc}); choose a directory this user can create and write",
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise RunLockError(
            f"trainer.default_local_dir={path} is in use by another run: {_describe(holder)} holds its lock "
            f"({root / LOCK}). Two runs in one directory would overwrite each other's checkpoints and metrics: wait "
            "for that run to end (or stop it), or choose another trainer.default_local_dir"
        ) from None
    except OSError as exc:  # a file system without locks: run, but say what is not guarded
        print(
            f"colorl: warning: trainer.default_local_dir={path}: its file system cannot lock files ({exc}); "
            "nothing stops a second run from using the same directory",
            file=sys.stderr,
        )
    previous = _holder(fd)
    if previous:
        print(
            f"colorl: taking over the run lock of {path} from {_describe(previous)}, which ended without "
            "releasing it (killed or crashed)",
            file=sys.stderr,
            flush=True,
        )
    me = psutil.Process()
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": me.pid, "started": me.create_time()}).encode(), 0)
    _held[key] = fd
    atexit.register(_release, fd)


def _release(fd: int) -> None:
    """An empty lock file is a released one: the next run takes it without a word."""
    os.ftruncate(fd, 0)
    os.close(fd)


def _holder(fd: int) -> dict[str, Any]:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {"unreadable": True}
    return holder if isinstance(holder, dict) else {"unreadable": True}


def _describe(holder: dict[str, Any]) -> str:
    if "pid" not in holder:
        return "a process that left no readable record"
    started = datetime.datetime.fromtimestamp(float(holder.get("started", 0))).isoformat(sep=" ", timespec="seconds")
    return f"pid {holder['pid']} on host {holder.get('host', '?')} (started {started})"
