"""The run's ledger of what was trained: per epoch, the prompts (by dataset index) each step drew, trained, filtered
out (dynamic sampling), dropped as too stale (the asynchronous modes), and those of which a response ended by a
failure (its reward function raised, timed out or gave no score: it scored 0).

``<trainer.default_local_dir>/ledger.jsonl`` holds one JSON line per step and epoch of the prompts drawn in it::

    {"step": 3, "epoch": 0, "drawn": [5, 2], "trained": [5, 2], "filtered": [], "dropped": [], "failed": [2]}

A line is appended and flushed to disk at the end of its step, before that step's checkpoint; each checkpoint holds
the digest of every line up to its step (``state``). A resume checks the file against them, drops the lines of the
steps after the checkpoint (they are computed again), and checks that every prompt of the epoch is drawn once: the
ledger's prompts of the epoch are the ones the checkpoint's data position has drawn, and those still in flight are
the ones the checkpoint's queue of batches generated ahead holds. Anything else is a ``LedgerError`` naming the file,
the line or the prompt, never a silent change.

In an epoch a drawn prompt ends once: trained, filtered or dropped (``OUTCOMES``), or it is still in flight (generated
ahead, not yet trained). ``failed`` is not an outcome: a prompt whose response failed is trained (or filtered) too.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data.dataset import INDEX
from single_controller.data_proto import DataProto
from trainer.state.checkpoint import CheckpointError
from trainer.state.data_position import EPOCH
from workers.checkpoint.safe_files import fsync, write_atomically

FILE = "ledger.jsonl"
OUTCOMES = ("trained", "filtered", "dropped")  # how a drawn prompt ends in its epoch, once
KINDS = ("drawn", *OUTCOMES, "failed")  # a line's lists, in the order they apply


class LedgerError(CheckpointError):
    """The ledger does not match the checkpoint, or a prompt would be trained twice or skipped in an epoch."""


def prompts(batch: DataProto) -> list[tuple[int, int]]:
    """The (epoch, dataset index) of each prompt of ``batch``, in row order, once each (its ``rollout.n`` rows are
    one prompt); none for a batch without the columns (a dataloader of the user's own)."""
    columns = batch.non_tensor_batch
    if INDEX not in columns or EPOCH not in columns:
        return []
    return list(dict.fromkeys(zip((int(e) for e in columns[EPOCH]), (int(i) for i in columns[INDEX]), strict=True)))


def _digest(line: str) -> str:
    return hashlib.sha256(line.encode()).hexdigest()[:16]


@dataclass
class Tally:
    """One epoch's counts: its prompts (``size``), those drawn, and each outcome's and the failed ones'."""

    epoch: int
    size: int
    drawn: int = 0
    trained: int = 0
    filtered: int = 0
    dropped: int = 0
    failed: int = 0

    def line(self) -> str:
        """``epoch 0: trained 14 of 16, filtered 2, dropped 0`` (and the failed ones, and what is still open)."""
        text = f"epoch {self.epoch}: trained {self.trained} of {self.size}, filtered {self.filtered}"
        text += f", dropped {self.dropped}"
        if self.failed:
            text += f", failed {self.failed}"
        in_flight = self.drawn - self.trained - self.filtered - self.dropped
        open_ = [f"{self.size - self.drawn} not drawn yet"] if self.drawn < self.size else []
        open_ += [f"{in_flight} in flight"] if in_flight else []
        return text + (f" ({', '.join(open_)})" if open_ else "")


class Ledger:
    """The ledger of the run in ``root``, whose epochs draw ``epoch_size`` prompts each."""

    def __init__(self, root: str | Path, epoch_size: int) -> None:
        self.path = Path(root) / FILE
        self.epoch_size = epoch_size
        self.lines: list[str] = []  # the file's lines so far
        self.since = 0  # the step the ledger counts from: 0, or a checkpoint saved without one
        self._step: dict[int, dict[str, list[int]]] = {}  # this step's prompts: epoch -> kind -> indices
        self._drawn: dict[int, dict[int, int]] = {}  # epoch -> index -> the step that drew it
        self._ended: dict[int, dict[int, tuple[str, int]]] = {}  # epoch -> index -> (outcome, step)
        self._failed: dict[int, set[int]] = {}

    # ------------------------------------------------------------------ recording
    def watch(self, batches: Iterable[DataProto]) -> Iterator[DataProto]:
        """``batches`` (the data position's), each recorded as drawn in the step that draws it."""
        for batch in batches:
            self.record("drawn", batch)
            yield batch

    def record(self, kind: str, batch: DataProto) -> None:
        """``batch``'s prompts as ``kind`` (one of ``KINDS``) in the step under way."""
        self.add(kind, prompts(batch))

    def add(self, kind: str, pairs: Iterable[tuple[int, int]]) -> None:
        """The prompts ``pairs`` (epoch, dataset index) as ``kind`` in the step under way."""
        for epoch, index in pairs:
            self._step.setdefault(epoch, {}).setdefault(kind, []).append(index)

    def end_step(self, step: int) -> None:
        """The step's lines: checked (a prompt ending twice in its epoch is a ``LedgerError``), appended, on disk."""
        lines = [
            json.dumps({"step": step, "epoch": epoch, **{kind: kinds.get(kind, []) for kind in KINDS}})
            for epoch, kinds in sorted(self._step.items())
        ]
        self._step = {}
        for line in lines:
            self._apply(json.loads(line))
        if not lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        if len(self.lines) == 0:
            fsync(self.path.parent)  # the file's own entry, when this made it
        self.lines += lines

    def _apply(self, entry: dict[str, Any]) -> None:
        step, epoch = entry["step"], entry["epoch"]
        drawn, ended = self._drawn.setdefault(epoch, {}), self._ended.setdefault(epoch, {})
        for index in entry["drawn"]:
            if index in drawn:
                raise LedgerError(
                    f"{self.path}: prompt {index} of epoch {epoch} drawn again at step {step} (first at step "
                    f"{drawn[index]}): it would train twice in the epoch"
                )
            drawn[index] = step
        for outcome in OUTCOMES:
            for index in entry[outcome]:
                if index not in drawn and not self.since:
                    where = f"{self.path}: prompt {index} of epoch {epoch}"
                    raise LedgerError(f"{where} {outcome} at step {step}, never drawn")
                drawn.setdefault(index, self.since)  # counting from a checkpoint without a ledger: drawn before it
                if index in ended:
                    was, at = ended[index]
                    raise LedgerError(
                        f"{self.path}: prompt {index} of epoch {epoch} {outcome} at step {step}, but already {was} "
                        f"at step {at}: it would train twice in the epoch"
                    )
                ended[index] = (outcome, step)
        self._failed.setdefault(epoch, set()).update(entry["failed"])

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Any]:
        """What a checkpoint holds: the digest of each line so far, and the step the ledger counts from."""
        return {"digests": [_digest(line) for line in self.lines], "since": self.since}

    def resume(
        self,
        state: dict[str, Any] | None,
        checkpoint: Path | None,
        step: int,
        drawn_in_epoch: tuple[int, list[int]],
        in_flight: list[DataProto],
    ) -> None:
        """Continue after ``checkpoint`` of ``step`` (None: a fresh start, at step 0) with its ledger ``state``:
        the file checked against its digests, the later steps' lines dropped, and the prompts checked against the
        data position (``drawn_in_epoch``: its epoch, and the indices it drew in it) and the batches still
        ``in_flight`` (generated ahead). A mismatch is a ``LedgerError``."""
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        self._drawn, self._ended, self._failed = {}, {}, {}  # loading twice (a test, a script) starts over
        if checkpoint is not None and (state is None or not self.path.exists()):  # it counts from here
            if state is not None:  # a checkpoint copied without its run's ledger (a cut file is refused below)
                print(
                    f"colorl: warning: no {FILE} in {self.path.parent} beside checkpoint {checkpoint} (copied "
                    f"without it?): the ledger counts from step {step}",
                    file=sys.stderr,
                    flush=True,
                )
            self.since, keep = step, []
        else:
            self.since = state["since"] if state else 0
            keep = self._checked(lines, state["digests"] if state else [], checkpoint, step)
        for line in keep:
            self._apply(json.loads(line))
        self.lines = keep
        if not self.since:
            self._check_epoch(*drawn_in_epoch)
            self._check_in_flight(in_flight)
        if keep != lines:
            write_atomically(self.path, "".join(line + "\n" for line in keep))

    def _checked(self, lines: list[str], digests: list[str], checkpoint: Path | None, step: int) -> list[str]:
        """The first ``len(digests)`` lines, each matching its digest; a later line must be of a later step."""
        saved = f"checkpoint {checkpoint}" if checkpoint is not None else "a fresh start (no checkpoint)"
        if len(lines) < len(digests):
            raise LedgerError(
                f"{self.path} holds {len(lines)} line(s), {saved} recorded {len(digests)} up to step {step}: the "
                "file was cut or replaced; restore it, or resume from another checkpoint (trainer.resume_from_path)"
            )
        for number, (line, digest) in enumerate(zip(lines, digests, strict=False), 1):
            if _digest(line) != digest:
                raise LedgerError(
                    f"{self.path} line {number} does not match {saved} (changed since step {step} was saved): "
                    "restore the file as it was, or resume from another checkpoint (trainer.resume_from_path)"
                )
        for number, line in enumerate(lines[len(digests) :], len(digests) + 1):
            try:
                later = int(json.loads(line)["step"]) > step
            except (ValueError, KeyError, TypeError):  # a line torn by a crash while it was appended
                later = True
            if not later:
                raise LedgerError(
                    f"{self.path} line {number} is of step {json.loads(line)['step']}, which {saved} (step {step}) "
                    "does not record: restore the file as it was, or resume from another checkpoint"
                )
        return lines[: len(digests)]

    def _check_epoch(self, epoch: int, drawn: list[int]) -> None:
        """The data position's epoch ``epoch`` drew ``drawn``: exactly the prompts the ledger records drawn in it."""
        recorded, order = self._drawn.get(epoch, {}), set(drawn)
        for index, step in recorded.items():
            if index not in order:
                raise LedgerError(
                    f"{self.path}: prompt {index} of epoch {epoch} was drawn at step {step}, but the checkpoint's data "
                    f"position has not drawn it ({len(drawn)} prompts of epoch {epoch} drawn): resuming would train it "
                    "twice in the epoch (did the data, data.seed, data.shuffle or data.train_batch_size change?)"
                )
        for index in drawn:
            if index not in recorded:
                raise LedgerError(
                    f"{self.path}: prompt {index} of epoch {epoch} was drawn before the checkpoint, but the ledger "
                    "records no step drawing it: resuming would skip it in the epoch (did the data, data.seed, "
                    "data.shuffle or data.train_batch_size change?)"
                )

    def _check_in_flight(self, batches: list[DataProto]) -> None:
        """The prompts drawn and not yet ended are exactly those of ``batches`` (the checkpoint's queue)."""
        queued = {prompt for batch in batches for prompt in prompts(batch)}
        for epoch, drawn in self._drawn.items():
            ended = self._ended.get(epoch, {})
            for index, step in drawn.items():
                if index not in ended and (epoch, index) not in queued:
                    raise LedgerError(
                        f"{self.path}: prompt {index} of epoch {epoch}, drawn at step {step}, is neither trained, "
                        "filtered nor dropped, and the checkpoint holds no batch with it: resuming would skip it"
                    )
        for epoch, index in sorted(queued):
            if index in self._ended.get(epoch, {}):
                was, step = self._ended[epoch][index]
                raise LedgerError(
                    f"{self.path}: the checkpoint's queue holds prompt {index} of epoch {epoch}, which was {was} at "
                    f"step {step}: resuming would train it twice in the epoch"
                )

    # ------------------------------------------------------------------ what it says
    def tallies(self) -> list[Tally]:
        """Each epoch's counts so far, oldest first."""
        out = []
        for epoch in sorted(self._drawn):
            ended = list(self._ended.get(epoch, {}).values())
            tally = Tally(epoch, self.epoch_size, len(self._drawn[epoch]), failed=len(self._failed.get(epoch, ())))
            for outcome in OUTCOMES:
                setattr(tally, outcome, sum(was == outcome for was, _ in ended))
            out.append(tally)
        return out

    def summary(self) -> list[str]:
        """One line per epoch (and what the ledger does not count: the steps before a checkpoint without one)."""
        lines = [tally.line() for tally in self.tallies()]
        if self.since and lines:
            lines.append(f"(counted from step {self.since}: no ledger before the checkpoint resumed from)")
        return lines
