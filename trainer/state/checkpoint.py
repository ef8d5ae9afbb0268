"""The checkpoint directories of a run: atomic commits, a ``latest`` pointer, pruning, picking one to resume.

Layout under ``trainer.default_local_dir``::

    global_step_6/
        actor/            model + optimizer shards (DCP: .metadata, __<r>_0.distcp), config.json, tokenizer,
                          extra.pt, rng_rank<r>.pt   (written by the workers: workers/checkpoint/shards.py)
        critic/           the same for the value model (when there is a critic)
        driver.pt         step, data position, KL controller, wandb run id, the resolved config
                          (trainer.state.fingerprint), the ledger's line digests (trainer.state.ledger), the
                          batches generated ahead (trainer.asynchronous.ahead)
        COMPLETE          size and SHA-256 of every file above: written last, verified on load
    latest_checkpointed_iteration.txt
    metrics.jsonl         (trainer.observing.tracking)
    ledger.jsonl          what each step trained, filtered and dropped, by dataset index (trainer.state.ledger)
    .colorl.lock          the run lock: one run per directory (trainer.state.run_dir)

A checkpoint is written into a hidden staging directory, every file and directory of it flushed to disk (fsync),
and only then renamed into place; older checkpoints are pruned once the rename itself is on disk. So a crash, a
power cut or a full disk at any moment leaves the previous checkpoint untouched and loadable (the file-safety
helpers: ``workers.checkpoint.safe_files``).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from config.checks import ConfigError
from planner.worker_roles import ACTOR, CRITIC
from workers.checkpoint.safe_files import (
    WRITE_ERRORS,
    UnsafeCheckpointError,
    damage,
    load_plain,
    recover_replaced,
    replace_dir,
    seal,
    write_atomically,
    write_error,
)

LATEST = "latest_checkpointed_iteration.txt"
COMPLETE = "COMPLETE"
PREFIX = "global_step_"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or resumed from."""


def _step_of(path: Path) -> int:
    return int(path.name[len(PREFIX) :])


def _manifest(path: Path) -> dict[str, dict[str, Any]]:
    try:
        files = json.loads((path / COMPLETE).read_text())["files"]
        if not all(isinstance(v, dict) and {"size", "sha256"} <= v.keys() for v in files.values()):
            raise ValueError("no size and sha256 for every file")
        return files
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path}/{COMPLETE} is unreadable ({exc})") from None


def check_checkpoint(path: Path) -> None:
    """Raise CheckpointError unless ``path`` is a complete checkpoint whose every file has its recorded checksum."""
    if not (path / COMPLETE).exists():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {COMPLETE} marker: interrupted while saving?)")
    damaged = damage(path, _manifest(path))
    if damaged:
        more = f" (and {len(damaged) - 1} more damaged file(s))" if len(damaged) > 1 else ""
        raise CheckpointError(f"{path} is corrupted: {damaged[0]}{more}")


class CheckpointManager:
    """Creates, commits, prunes and finds the checkpoints of one run directory."""

    def __init__(
        self, root: str, max_actor_ckpt_to_keep: int | None = None, max_critic_ckpt_to_keep: int | None = None
    ):
        self.root = Path(root)
        self.keep = {ACTOR.name: max_actor_ckpt_to_keep, CRITIC.name: max_critic_ckpt_to_keep}

    def staging_path(self, step: int) -> Path:
        """The hidden directory that step ``step`` is written into before it is committed."""
        return self.root / f".{PREFIX}{step}.staging"

    @staticmethod
    def make_staging(staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)  # left over from a save that was killed
        staging.mkdir(parents=True)

    def commit(self, staging: Path, step: int, driver_state: dict[str, Any]) -> Path:
        """Seal ``staging`` (driver state, checksum manifest, all on disk), move it into place, point ``latest`` at
        it, then prune: nothing older is deleted before the new checkpoint is durable."""
        try:
            torch.save(driver_state, staging / "driver.pt")
            write_atomically(staging / COMPLETE, json.dumps({"step": step, "files": seal(staging)}))
        except WRITE_ERRORS as exc:  # a full disk: the caller abandons the staging directory
            raise write_error(staging, exc, "the driver ") from exc
        recover_replaced(self.root)
        final = self.root / f"{PREFIX}{step}"
        replace_dir(staging, final)  # re-saving the same step sets the old one aside until the new one is in place
        write_atomically(self.root / LATEST, str(step))
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

    def _refuse_to_mix(self) -> None:
        """A fresh run must not overwrite an earlier run's checkpoints or append to its metrics."""
        earlier = [p.name for p in self.checkpoints()] + [p.name for p in self.root.glob("metrics.jsonl")]
        if earlier:  # a key's value the user can change: a config error (one line, exit status 2)
            raise ConfigError(
                f"trainer.resume_mode=disable, but trainer.default_local_dir={self.root} already holds a run "
                f"({', '.join(earlier[-3:])}): a fresh run there would overwrite its checkpoints and mix into its "
                "metrics. Continue it with trainer.resume_mode=auto, or start afresh in another "
                "trainer.default_local_dir (or remove this one)"
            )

    def find(self, resume_mode: str, resume_from_path: str | None = None) -> Path | None:
        """The checkpoint to resume from: None for a fresh start."""
        if resume_mode == "disable":
            self._refuse_to_mix()
            return None
        recover_replaced(self.root)
        if resume_mode == "resume_path":
            path = Path(resume_from_path)
            if not path.is_dir():
                raise ConfigError(f"trainer.resume_from_path={resume_from_path}: no such checkpoint directory")
            check_checkpoint(path)
            return path
        path, damaged = self._newest_intact(warn=True)
        if path is None and damaged:  # starting again from step 1 here would mix two runs
            raise CheckpointError(
                f"trainer.default_local_dir={self.root} holds checkpoints, but none is intact: {'; '.join(damaged)}. "
                "Nothing was changed. Resume from an intact copy (trainer.resume_mode=resume_path "
                "trainer.resume_from_path=...), or start afresh in another trainer.default_local_dir (or remove "
                "these checkpoints)"
            )
        return path

    def latest(self) -> Path | None:
        """The newest intact checkpoint, or None (for messages: nothing is printed about the others)."""
        return self._newest_intact(warn=False)[0]

    def _newest_intact(self, warn: bool) -> tuple[Path | None, list[str]]:
        """The newest checkpoint that passes ``check_checkpoint``, and what is wrong with each newer one."""
        damaged = []
        for path in reversed(self.checkpoints()):
            try:
                check_checkpoint(path)
                return path, damaged
            except CheckpointError as exc:
                damaged.append(str(exc))
                if warn:
                    warnings.warn(f"skipping checkpoint: {exc}; trying the previous one", stacklevel=3)
        return None, damaged


def load_driver_state(path: Path) -> dict[str, Any]:
    """The driver's state in checkpoint ``path`` (tensors and plain types only: see ``load_plain``)."""
    try:
        return load_plain(Path(path) / "driver.pt")
    except UnsafeCheckpointError as exc:
        raise CheckpointError(str(exc)) from None
