"""The single controller's errors: arguments that break a precondition of its API, and a worker that died (raised
by ray/health.py; here so that a run without Ray names it without importing Ray)."""

from typing import Any

__all__ = ["ContractError", "WorkerDiedError"]


class ContractError(ValueError, AssertionError):
    """Arguments that break a documented precondition (sizes that differ, a key that would be overwritten, ...).

    It is a ``ValueError``, as every argument check in ColoRL is, and an ``AssertionError`` as well, because
    code that states these preconditions as ``assert``s, and catches ``AssertionError`` (ported code and its tests
    do), must see the same failure here.
    """


def where(process: dict[str, Any]) -> str:
    """Where a worker ran, as error lines say it."""
    return f"pid {process.get('pid', '?')} on node {process.get('node_ip', '?')} ({process.get('host', '?')})"


class WorkerDiedError(RuntimeError):
    """A worker process died (killed, out of memory, crashed) while the driver waited on it."""

    def __init__(self, call: str, rank: int, world_size: int, process: dict[str, Any], cause: str) -> None:
        self.call, self.rank, self.process = call, rank, process
        super().__init__(f"worker rank {rank} of {world_size} died during {call}: {where(process)}; {cause}")
