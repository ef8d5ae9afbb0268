"""File safety for checkpoints and run directories: nothing half-written is ever taken for whole, nothing read back
can run code.

Both sides of a checkpoint use these: the workers writing their shards (``workers.checkpoint.shards``) and the driver
sealing, committing and verifying a checkpoint directory (``trainer.state.checkpoint``).

- :func:`fsync`, :func:`write_atomically`: data on disk before anything that vouches for it (a rename, a marker);
- :func:`seal` and :func:`damage`: the size and SHA-256 of every file of a directory, and what no longer matches;
- :func:`replace_dir` and :func:`recover_replaced`: a staging directory renamed into place, an older one of the
  same name set aside until then and put back if a crash came in between;
- :data:`WRITE_ERRORS`, :func:`write_error`: a failed write (a full disk) as one message with the path and the
  space left;
- :func:`load_plain`: ``torch.load`` of tensors and plain types only.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

REPLACED = ".replaced"  # suffix of a directory set aside by replace_dir until its successor is in place


def fsync(path: str | Path) -> None:
    """Flush ``path`` (a file, or a directory's entries) to stable storage: a rename or a marker that reaches the
    disk before the data it vouches for would survive a power cut that the data does not."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` so that a crash leaves the old or the new content, both on disk."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync(path.parent)


def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _parallel(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """``fn`` over ``items`` in threads: hashing and fsync release the GIL, and a checkpoint has a shard per rank."""
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return list(pool.map(fn, items))


def seal(root: Path) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of every file below ``root``, each file and directory flushed to disk on the way."""
    paths = sorted(root.rglob("*"))
    files = [p for p in paths if p.is_file()]
    digests = _parallel(_digest, files)
    _parallel(fsync, [*paths, root])
    return {os.fspath(p.relative_to(root)): {"size": p.stat().st_size, "sha256": d} for p, d in zip(files, digests)}


def _file_damage(root: Path, name: str, expected: dict[str, Any]) -> str | None:
    file = root / name
    if not file.is_file():
        return f"{name} is missing"
    size = file.stat().st_size
    if size != expected["size"]:
        return f"{name} has {size} bytes instead of {expected['size']} (truncated or overwritten)"
    if _digest(file) != expected["sha256"]:
        return f"{name} does not match its SHA-256 checksum (damaged on disk or altered)"
    return None


def damage(root: Path, manifest: dict[str, dict[str, Any]]) -> list[str]:
    """What no longer matches ``manifest`` (:func:`seal`'s) below ``root``, one phrase per file; empty when sound."""
    found = _parallel(lambda item: _file_damage(root, *item), sorted(manifest.items()))
    return [d for d in found if d]


def replace_dir(staging: Path, final: Path) -> None:
    """Rename ``staging`` to ``final`` and flush the rename; an existing ``final`` is set aside
    (``.<name>.replaced``) until then and deleted after, so a crash in between leaves one of the two in place."""
    replaced = final.with_name(f".{final.name}{REPLACED}")
    if final.exists():
        os.rename(final, replaced)
    os.rename(staging, final)
    fsync(final.parent)
    shutil.rmtree(replaced, ignore_errors=True)


def recover_replaced(root: Path) -> None:
    """Finish a :func:`replace_dir` that a crash cut short: the old directory goes back unless the new one made it."""
    for replaced in root.glob(f".*{REPLACED}"):
        final = root / replaced.name[1 : -len(REPLACED)]
        if final.exists():
            shutil.rmtree(replaced)
        else:
            os.rename(replaced, final)
            fsync(root)


# What the writers raise when a write fails part-way (e.g. a full disk): OSError from plain files, RuntimeError
# from torch.save's zip writer, CheckpointException (a BaseException) from DCP, on every rank, for any rank's.
WRITE_ERRORS = (OSError, RuntimeError, CheckpointException)


class CheckpointWriteError(OSError):
    """A checkpoint file that could not be written (e.g. a full disk); the message names the path and free space."""


def write_error(path: str | Path, exc: BaseException, who: str = "") -> CheckpointWriteError:
    """A :class:`CheckpointWriteError` for writing under ``path`` failing with ``exc``, with the space left there."""
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if isinstance(exc, CheckpointException) and exc.failures:  # DCP's: every rank's error; name the first
        exc = next(iter(exc.failures.values()))[0]
    first_line = (str(exc).splitlines() or [""])[0]
    return CheckpointWriteError(
        f"{who}could not write the checkpoint to {path}: {type(exc).__name__}: {first_line} "
        f"({free / 2**20:.1f} MiB free on that file system)"
    )


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holding pickled objects beyond tensors and plain types (loading it could run code)."""


def load_plain(file: str | Path | io.BytesIO, name: str | None = None) -> Any:
    """``torch.load`` restricted to tensors and plain Python types (``weights_only``): a checkpoint may come from a
    shared file system or ``trainer.resume_from_path``, and unpickling anything else can run arbitrary code."""
    try:
        return torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        first_line = (str(exc).splitlines() or [""])[0]
        raise UnsafeCheckpointError(
            f"refusing to load {name or file}: it holds pickled Python objects other than tensors and plain types, "
            f"which could run code when loaded (a crafted file, or one written by an older ColoRL): {first_line}"
        ) from None
