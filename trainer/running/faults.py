"""Faults named in one line: an exception raised inside a worker, a worker killed for memory, a full object store.

``named(exc)`` is what ``trainer.running.restarts`` raises instead of a Ray exception that ends the run: a
:class:`FaultError` whose message gives the worker's role and method, rank, pid and node and the exception
(``single_controller.ray.health.WorkerCall``); for out of memory also the config keys that size that method's
micro-batches; for a full object store, that it is one and what to change. Anything else stays as it was.
"""

from __future__ import annotations

import sys

from config.tree import ARR
from planner.batching import PHASE_BATCHES
from planner.phases import STEP_PHASES
from single_controller.errors import WorkerDiedError

# what to lower when a worker phase (of planner.phases.STEP_PHASES, by name) runs out of memory, where its batch keys
# (planner.batching.PHASE_BATCHES) are not what sizes it: generation holds every row of the worker at once
OOM_ADVICE = {
    "gen": "data.train_batch_size or data.max_response_length (a worker generates its whole share of "
    f"data.train_batch_size × {ARR}.rollout.n at once)",
}
# worker method -> the config keys that bound its memory, lowest-hanging first: a step's phases' (OOM_ADVICE, else
# their batch keys), and loading the models
MEMORY_KEYS = {
    "init_model": "actor_rollout_ref.actor.fsdp_config.param_offload/optimizer_offload (or more workers: "
    "trainer.n_gpus_per_node)",
    **{p.method: OOM_ADVICE.get(p.name) or PHASE_BATCHES[p.name].keys() for p in STEP_PHASES if p.method},
}
STORE_HINT = (
    "the Ray object store is full, and so is the disk it spills to: free space in Ray's temp dir (default "
    "/tmp/ray) or give the nodes more memory, or move less per step: lower data.train_batch_size or "
    "data.max_response_length"
)


def ray_error() -> tuple[type[BaseException], ...]:
    """Ray's base exception when this process imported Ray (a Ray run), else nothing to catch (a run without Ray)."""
    ray = sys.modules.get("ray")
    return (ray.exceptions.RayError,) if ray is not None else ()


def _object_store_full() -> tuple[type[BaseException], ...]:
    ray = sys.modules.get("ray")
    return (ray.exceptions.ObjectStoreFullError, ray.exceptions.OutOfDiskError) if ray is not None else ()


class FaultError(RuntimeError):
    """A fault that ended the run, in one line."""


def named(exc: BaseException) -> BaseException:
    """``exc`` as one line (a :class:`FaultError`) when it is a worker's exception, a worker killed for memory or
    a full object store; else ``exc`` itself."""
    cause = getattr(exc, "cause", None) or exc  # a RayTaskError carries the worker's own exception as .cause
    worker_call = getattr(exc, "worker_call", None)
    if isinstance(exc, WorkerDiedError):
        return FaultError(f"{exc}; {_memory_hint(exc.call)}") if "memory" in str(exc).lower() else exc
    if isinstance(cause, _object_store_full()):
        where = f"{worker_call.describe(cause)}: " if worker_call else ""
        return FaultError(f"{where}{STORE_HINT}")
    if worker_call is None:
        return exc
    line = worker_call.describe(cause)
    return FaultError(f"{line}; {_memory_hint(worker_call.call)}" if _out_of_memory(cause) else line)


def _out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, Python's MemoryError, or the CPU allocator's RuntimeError."""
    text = str(exc).lower()
    return (
        isinstance(exc, MemoryError)
        or type(exc).__name__ == "OutOfMemoryError"
        or (isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text))
    )


def _memory_hint(call: str) -> str:
    keys = MEMORY_KEYS.get(call.rpartition(".")[2])
    return f"out of memory: lower {keys}" if keys else "out of memory: lower the micro-batch sizes (*micro_batch_size*)"
