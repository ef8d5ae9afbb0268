"""A worker process's tensors of the current step: what one phase wrote and a later phase of the same step reads.

The colocated roles of a rank (actor and rollout, reference, critic, reward model) live in one process, so one
store per process (``STORE``) serves them all: the rollout's sequences stay where the log-prob, value and update
phases read them, and the driver gets only what it computes with. Which keys are sent, fetched, kept and given
back is each phase's ``Route`` (``planner.dataflow``, derived from ``planner.phases.declare_flows``).

A routed call (``trainer.running.routing.request``, on the driver) carries ``meta_info[STEP] = StepCall(token, route)``
and the global index of each of its rows (``ROWS``); ``trainer.running.routing.take_back`` merges the answer into the
driver's batch. The first phase
of a step that keeps something opens the store for that token and those rows; a phase that fetches must come
with the same token and rows, else it fails loudly (a worker restarted, a run resumed on another world size, a
call from another step) instead of computing on foreign data. A call without ``meta_info[STEP]`` (self-contained:
tests, ported code) carries every input itself and gets every output back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from planner.dataflow import Route
from single_controller.data_proto import DataProto

STEP = "colorl_step"  # meta_info key of a routed call: its StepCall
ROWS = "colorl_rows"  # batch key of a routed call: each row's index in the step's batch (int64)


@dataclass(frozen=True)
class StepCall:
    """A worker call within a step: the step's token (fresh for every step) and the phase's route."""

    token: str
    route: Route


class StepStoreError(RuntimeError):
    """A routed call for tensors this process does not hold: another step, other rows, or a key never kept."""


class StepStore:
    """One step's kept tensors (on CPU) of this process's rows, keyed by the step's token."""

    def __init__(self) -> None:
        self.token: str | None = None
        self.rows: Tensor | None = None
        self.tensors: dict[str, Tensor] = {}

    def inputs(self, call: DataProto) -> DataProto:
        """The inputs of a phase called with ``call``: ``call`` itself when direct; else the keys it was sent plus
        those kept here (and the non-tensor columns it was sent), nothing else."""
        step = call.meta_info.get(STEP)
        if step is None:
            return call
        tensors = {k: call.batch[k] for k in step.route.send}
        if step.route.fetch:
            self._check(step, call.batch[ROWS])
            missing = [k for k in step.route.fetch if k not in self.tensors]
            if missing:
                raise StepStoreError(
                    f"phase {step.route.phase!r} of step {step.token} fetches {missing}, which no "
                    f"earlier phase kept here (kept: {sorted(self.tensors)})"
                )
            tensors.update({k: self.tensors[k] for k in step.route.fetch})
        return DataProto.from_dict(tensors, call.non_tensor_batch, meta_info=call.meta_info)

    def outputs(
        self,
        call: DataProto,
        produced: dict[str, Tensor],
        meta_info: dict | None = None,
        non_tensors: dict[str, Any] | None = None,
    ) -> DataProto:
        """What the phase called with ``call`` returns: every key ``produced`` when direct; else it keeps
        ``route.keep`` here and returns ``route.give``. Tensors are detached and on CPU; per-row ``non_tensors``
        (the agent loop's statistics) always go back."""
        produced = {k: v.detach().cpu() for k, v in produced.items()}
        step = call.meta_info.get(STEP)
        if step is None:
            return DataProto.from_dict(produced, non_tensors, meta_info=meta_info)
        if step.route.keep:
            if step.token != self.token:  # the step's first phase that keeps something: the store is this step's
                self.token, self.rows, self.tensors = step.token, call.batch[ROWS], {}
            else:
                self._check(step, call.batch[ROWS])
            self.tensors.update({k: produced[k] for k in step.route.keep})
        return DataProto.from_dict({k: produced[k] for k in step.route.give}, non_tensors, meta_info=meta_info)

    def _check(self, step: StepCall, rows: Tensor) -> None:
        if step.token != self.token:
            raise StepStoreError(
                f"phase {step.route.phase!r} is for step {step.token}, but this worker holds "
                f"{'step ' + self.token if self.token else 'no step'} (restarted, or a stale call?)"
            )
        if self.rows is None or not torch.equal(rows, self.rows):
            raise StepStoreError(
                f"phase {step.route.phase!r} of step {step.token} is for rows {_span(rows)}, but "
                f"this worker holds rows {_span(self.rows)}"
            )


def _span(rows: Tensor | None) -> str:
    return "none" if rows is None or rows.numel() == 0 else f"{int(rows[0])}..{int(rows[-1])} ({rows.numel()})"


STORE = StepStore()  # this process's: every role of a colocated worker shares it
