"""Which per-token keys each worker phase really computes with, recorded inside the worker processes of a run.

``record_reads`` (run in each worker through ``__ray_call__``) wraps every tensor a routed phase gets from its step
store's ``inputs`` in a ``Recorded`` tensor: moving its rows or device keeps the wrapper, any other use (an op, its
shape) notes the key under the phase and unwraps. ``recorded_reads`` returns what was noted; ``assert_declared``
compares it with the routes of the plan (``planner.phases.declare_flows``): a phase given a key it never uses, or
missing one it needs (it would fail on the missing key), shows up there.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from workers.compute import step_store

READS: dict[str, set[str]] = {}  # phase -> keys used, in this worker process
_MOVES = {torch.Tensor.__getitem__, torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.contiguous, torch.Tensor.detach}


class Recorded(torch.Tensor):
    """A phase's input tensor that notes its key in ``READS`` when it is used for anything but moving."""

    phase: str
    key: str

    @classmethod
    def wrap(cls, tensor: torch.Tensor, phase: str, key: str) -> Recorded:
        with torch._C.DisableTorchFunctionSubclass():
            out = tensor.as_subclass(cls)
        out.phase, out.key = phase, key
        return out

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
            first = args[0] if args else None
            if func in _MOVES and isinstance(first, Recorded) and isinstance(out, torch.Tensor):
                return cls.wrap(out, first.phase, first.key)
            for value in pytree.tree_leaves((args, kwargs)):
                if isinstance(value, Recorded):
                    READS.setdefault(value.phase, set()).add(value.key)
            return out.as_subclass(torch.Tensor) if isinstance(out, Recorded) else out


def record_reads(_worker: Any) -> None:
    """From now on, note what each routed phase of this worker process reads."""
    original = step_store.StepStore.inputs

    def inputs(self: step_store.StepStore, call: Any) -> Any:
        data = original(self, call)
        step = call.meta_info.get(step_store.STEP)
        if step is not None:
            for key, tensor in list(data.batch.items()):
                dict.__setitem__(data.batch, key, Recorded.wrap(tensor, step.route.phase, key))
        return data

    step_store.StepStore.inputs = inputs


def recorded_reads(_worker: Any) -> dict[str, set[str]]:
    return READS


def assert_declared(trainer: Any, per_rank: list[dict[str, set[str]]], phases: set[str]) -> None:
    """Every rank's recorded reads of each of ``phases`` are exactly the declared ones, in every flow that runs it."""
    declared: dict[str, set[str]] = {}
    for flow in trainer.plan.flows.values():
        for route in flow.routes:
            declared.setdefault(route.phase, set()).update(route.reads)
    for rank, reads in enumerate(per_rank):
        assert set(reads) == phases, f"rank {rank} ran phases {sorted(reads)}"
        for phase in phases:
            assert reads[phase] == declared[phase], (
                f"rank {rank}, phase {phase!r}: read {sorted(reads[phase])}, declared {sorted(declared[phase])}"
            )
