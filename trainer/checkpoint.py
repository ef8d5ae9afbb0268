"""The checkpoint directories of a run: atomic commits, a ``latest`` pointer, pruning, picking one to resume.

Layout under ``trainer.default_local_dir``::

    global_step_6/
        actor/            HF model dir + optimizer.pt, extra.pt, rng_rank<r>.pt   (written by the workers)
        critic/           the same for the value model (when there is a critic)
        driver.pt         step, data position, KL controller, wandb run id
        COMPLETE          the size of every file above: written last, checked on load
    latest_checkpointed_iteration.txt

A checkpoint is written into a hidden staging directory and renamed into place only once complete, so a
crash (or a full disk) at any moment leaves the previous checkpoint untouched and loadable.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from workers.checkpoint import UnsafeCheckpointError, load_plain

LATEST = "latest_checkpointed_iteration.txt"
COMPLETE = "COMPLETE"
PREFIX = "global_step_"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or resumed from."""


def _step_of(path: Path) -> int:
    return int(path.name[len(PREFIX) :])


def _file_sizes(root: Path) -> dict[str, int]:
    return {os.fspath(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def check_checkpoint(path: Path) -> None:
    """Raise CheckpointError unless ``path`` is a complete checkpoint whose files all have their saved sizes."""
    marker = path / COMPLETE
    if not marker.exists():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {COMPLETE} marker: interrupted while saving?)")
    try:
        expected = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}/{COMPLETE} is unreadable ({exc})") from None
    actual = {k: v for k, v in _file_sizes(path).items() if k != COMPLETE}
    damaged = sorted(k for k in expected if actual.get(k) != expected[k])
    if damaged:
        raise CheckpointError(f"{path} is corrupted: {len(damaged)} file(s) missing or truncated, e.g. {damaged[:3]}")


class CheckpointManager:
    """Creates, commits, prunes and finds the checkpoints of one run directory."""

    def __init__(self, root: str, max_actor_ckpt_to_keep: int | None = None, max_critic_ckpt_to_keep: int | None = None):
        self.root = Path(root)
        self.keep = {"actor": max_actor_ckpt_to_keep, "critic": max_critic_ckpt_to_keep}

    def staging_path(self, step: int) -> Path:
        """The hidden directory that step ``step`` is written into before it is committed."""
        return self.root / f".{PREFIX}{step}.staging"

    @staticmethod
    def make_staging(staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)  # left over from a save that was killed
        staging.mkdir(parents=True)

    def commit(self, staging: Path, step: int, driver_state: dict[str, Any]) -> Path:
        """Seal ``staging`` (driver state, size manifest), move it into place, point ``latest`` at it, prune."""
        torch.save(driver_state, staging / "driver.pt")
        _write_atomically(staging / COMPLETE, json.dumps({"step": step, "files": _file_sizes(staging)}))
        final = self.root / f"{PREFIX}{step}"
        if final.exists():  # re-saving the same step (e.g. after a restart): replace it whole
            shutil.rmtree(final)
        os.rename(staging, final)
        _write_atomically(self.root / LATEST, str(step))
        self._prune()
        return final

    def abandon(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)

    def checkpoints(self) -> list[Path]:
        """Committed checkpoint directories, oldest first."""
        dirs = [p for p in self.root.glob(f"{PREFIX}*") if p.is_dir() and p.name[len(PREFIX) :].isdigit()]
        return sorted(dirs, key=_step_of)

    def _prune(self) -> None:
        complete = [p for p in self.checkpoints() if (p / COMPLETE).exists()]
        for role, keep in self.keep.items():
            if keep is None:
                continue
            for old in complete[:-keep]:
                shutil.rmtree(old / role, ignore_errors=True)
        for old in complete:
            if not any((old / role).exists() for role in self.keep):
                shutil.rmtree(old)

    def find(self, resume_mode: str, resume_from_path: str | None = None) -> Path | None:
        """The checkpoint to resume from: None for a fresh start."""
        if resume_mode == "disable":
            return None
        if resume_mode == "resume_path":
            path = Path(resume_from_path)
            if not path.is_dir():
                raise CheckpointError(f"trainer.resume_from_path={resume_from_path}: no such checkpoint directory")
            check_checkpoint(path)
            return path
        for path in reversed(self.checkpoints()):  # auto: the newest sound one
            try:
                check_checkpoint(path)
                return path
            except CheckpointError as exc:
                warnings.warn(f"skipping checkpoint: {exc}; trying the previous one", stacklevel=2)
        return None


def load_driver_state(path: Path) -> dict[str, Any]:
    """The driver's state in checkpoint ``path`` (tensors and plain types only: see ``load_plain``)."""
    try:
        return load_plain(Path(path) / "driver.pt")
    except UnsafeCheckpointError as exc:
        raise CheckpointError(str(exc)) from None
