"""Worker liveness: notice a dead worker at once, say which one it was, dump stacks, tear a group down.

A rank that dies in the middle of a collective leaves its peers blocked (gloo and NCCL wait up to their
timeout), so a plain ``ray.get`` over all ranks could wait minutes on the peers before it saw the death.
``get_alive`` takes each result as it arrives instead, and the first ``RayActorError`` becomes a
``WorkerDiedError`` naming the call, the rank and the node. Those come from ``describe_processes``, asked
once when the group starts, because a dead process cannot describe itself. An exception a live worker raised
is re-raised as it is, marked with the ``WorkerCall`` it came from.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from single_controller.errors import WorkerDiedError
from single_controller.errors import where as _where

__all__ = [
    "WorkerCall",
    "WorkerDiedError",
    "describe_processes",
    "get_alive",
    "in_flight",
    "dump_stacks",
    "stall_report",
    "shutdown_worker_group",
]

# Workers register faulthandler on this signal: the stack dump when py-spy is not installed.
STACK_SIGNAL = signal.SIGUSR1
_in_flight: dict[str, list[int]] = {}  # call -> ranks still running it (read by a watchdog thread)
_in_flight_lock = threading.Lock()


@dataclass(frozen=True)
class WorkerCall:
    """Which worker raised an exception, set by ``get_alive`` on that exception as ``exc.worker_call``: the
    exception keeps its own type (the caller may catch it as what it is), and a top level can still report it
    in one line (``describe``)."""

    call: str  # role.method, e.g. actor_rollout.update_actor
    rank: int
    world_size: int
    process: dict[str, Any]

    def describe(self, cause: BaseException) -> str:
        first = (str(cause).splitlines() or [""])[0]
        return (
            f"worker rank {self.rank} of {self.world_size} raised {type(cause).__name__} during {self.call}: "
            f"{_where(self.process)}; {first}"
        )


# ---------------------------------------------------------------------------------- at start-up
def _describe_process(actor: Any) -> dict[str, Any]:
    """Runs inside a worker: who it is; also arms the faulthandler stack dump (to its stderr log)."""
    faulthandler.register(STACK_SIGNAL, all_threads=True)
    stderr = os.readlink("/proc/self/fd/2") if os.path.islink("/proc/self/fd/2") else None
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "node_ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "stderr": stderr,
    }


def describe_processes(workers: list) -> list[dict[str, Any]]:
    """``pid``, ``host``, ``node_ip``, ``node_id`` and ``stderr`` (log path) of each actor, in rank order."""
    return ray.get([w.__ray_call__.remote(_describe_process) for w in workers])


# ---------------------------------------------------------------------------------- waiting
def get_alive(refs: Any, call: str, processes: list[dict[str, Any]] | None = None) -> Any:
    """``ray.get(refs)`` (a list in rank order, or one rank-0 ref) that fails fast when a worker dies.

    Raises ``WorkerDiedError`` as soon as any rank's actor is dead, and a worker's own exception as soon
    as that rank raises it, without waiting on the other ranks beyond ``DEATH_GRACE_S`` — the time a peer's
    death gets to show, since a rank killed mid-collective first surfaces as its peers' connection errors.
    """
    single = not isinstance(refs, list)
    refs = [refs] if single else refs
    rank_of = {ref: rank for rank, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    try:
        while pending:
            with _in_flight_lock:
                _in_flight[call] = sorted(rank_of[ref] for ref in pending)
            ready, pending = ray.wait(pending, num_returns=1)
            rank = rank_of[ready[0]]
            try:
                results[rank] = ray.get(ready[0])
            except RayActorError as exc:
                raise _died(call, rank, len(refs), processes, exc) from exc
            except Exception as exc:
                # a peer's death often reaches a live rank first, as a failed collective: name the death
                _raise_if_any_died(pending, rank_of, call, len(refs), processes)
                exc.worker_call = WorkerCall(call, rank, len(refs), processes[rank] if processes else {})
                raise
    finally:
        with _in_flight_lock:
            _in_flight.pop(call, None)
    return results[0] if single else results


DEATH_GRACE_S = 5.0  # how long a worker's exception waits for news of a dead peer that may have caused it


def _died(call: str, rank: int, world_size: int, processes: list | None, exc: RayActorError) -> WorkerDiedError:
    return WorkerDiedError(call, rank, world_size, processes[rank] if processes else {}, _cause(exc))


def _raise_if_any_died(pending: list, rank_of: dict, call: str, world_size: int, processes: list | None) -> None:
    """Raise ``WorkerDiedError`` if one of the ``pending`` ranks turns out dead within ``DEATH_GRACE_S``."""
    if not pending:
        return
    ready, _ = ray.wait(pending, num_returns=len(pending), timeout=DEATH_GRACE_S)
    for ref in ready:
        try:
            ray.get(ref)
        except RayActorError as exc:
            raise _died(call, rank_of[ref], world_size, processes, exc) from exc
        except Exception:  # another rank's own error: the first one is reported
            continue


def _cause(exc: RayActorError) -> str:
    """The informative part of Ray's long actor-death message: why it is dead, without the generic advice."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = next((line for line in lines if line.startswith("The actor is dead because")), lines[0] if lines else "")
    return reason.split(" Some common causes")[0] or type(exc).__name__


def in_flight() -> dict[str, list[int]]:
    """The group calls the driver is waiting on now, and the ranks that have not answered yet."""
    with _in_flight_lock:
        return {call: list(ranks) for call, ranks in _in_flight.items()}


# ---------------------------------------------------------------------------------- stacks
def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"  # a virtualenv's bin/ need not be on PATH
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _stack_of(pid: int, stderr: str | None) -> str:
    """Python stacks of process ``pid`` on this host: ``py-spy dump``, else the worker's faulthandler."""
    py_spy = _py_spy()
    if py_spy:
        out = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
        if out.returncode == 0:
            return out.stdout
    if stderr is None or not os.path.isfile(stderr):
        os.kill(pid, STACK_SIGNAL)
        return "(no py-spy: faulthandler wrote the stacks to the worker's stderr log)"
    start = os.path.getsize(stderr)
    os.kill(pid, STACK_SIGNAL)
    time.sleep(1.0)  # faulthandler writes from a signal handler; give it a moment
    with open(stderr, errors="replace") as f:
        f.seek(start)
        return f.read()


_remote_stack_of = ray.remote(num_cpus=0)(_stack_of)


def dump_stacks(processes: list[dict[str, Any]], ranks: list[int] | None = None, timeout_s: float = 90.0) -> str:
    """The Python stacks of ``ranks`` (default: all) of a group; remote hosts are asked through a Ray task."""
    parts = []
    for rank in range(len(processes)) if ranks is None else ranks:
        proc = processes[rank]
        try:
            if proc["host"] == socket.gethostname():
                text = _stack_of(proc["pid"], proc["stderr"])
            else:
                strategy = NodeAffinitySchedulingStrategy(proc["node_id"], soft=False)
                ref = _remote_stack_of.options(scheduling_strategy=strategy).remote(proc["pid"], proc["stderr"])
                text = ray.get(ref, timeout=timeout_s)
        except Exception as exc:  # a stack dump is best effort: report why it failed and go on
            text = f"(no stack: {type(exc).__name__}: {exc})"
        parts.append(f"--- rank {rank}: pid {proc['pid']} on {proc['node_ip']} ({proc['host']}) ---\n{text.rstrip()}")
    return "\n".join(parts)


def stall_report(processes: list[dict[str, Any]]) -> str:
    """What the driver is waiting on (call and ranks) and every worker's stacks: the report of a hang."""
    busy = in_flight()
    lines = [f"waiting on {call} at rank(s) {ranks}" for call, ranks in busy.items()]
    lines = lines or ["no worker call in flight: the driver itself is stalled"]
    return "\n".join([*lines, dump_stacks(processes)])


# ---------------------------------------------------------------------------------- teardown
def shutdown_worker_group(worker_group: Any) -> None:
    """Kill every actor of a ``RayWorkerGroup`` and free its placement groups; nothing outlives it."""
    for worker in worker_group.workers:
        ray.kill(worker, no_restart=True)
    if worker_group.resource_pool is not None:  # a group attached to running workers holds no placement groups
        worker_group.resource_pool.release()
