"""Running a tool's code without letting it end the run: threads with a deadline, and checked results.

Every call into a tool (``create``, ``execute``, ``calc_reward``, ``release``) runs in its own daemon thread;
the calls of all trajectories whose assistant turn ended at the same decoding step run at once, and the loop
waits for them until ``timeout_s``. A call that raises, returns something that is not a tool result, or is
still running at the deadline yields an error message for the model instead of a value. A thread cannot be
stopped from outside, so a call that never returns keeps its (daemon) thread; its trajectory goes on.

Threads rather than an event loop: the decode loop is synchronous torch code, a plain ``def`` tool cannot be
cancelled by asyncio (``wait_for`` on a blocking call never fires), and a thread's deadline holds for both
kinds. An ``async def`` method is run to completion in its thread's own event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Outcome:
    value: Any = None
    error: str | None = None  # None: the call returned ``value``


class ToolResultError(ValueError):
    """A tool returned something that is not a tool result."""


async def _wait(awaitable: Any) -> Any:
    return await awaitable


def _call(function: Callable[[], Any]) -> Any:
    result = function()
    return asyncio.run(_wait(result)) if inspect.isawaitable(result) else result


def run_all(functions: list[Callable[[], Any]], timeout_s: float) -> list[Outcome]:
    """Run every function in its own thread at once; each one's value, or its error / a timeout message."""
    outcomes = [Outcome() for _ in functions]

    def target(i: int) -> None:
        try:
            outcomes[i] = Outcome(value=_call(functions[i]))
        except Exception as exc:  # the tool's own failure: reported to the model, never raised here
            outcomes[i] = Outcome(error=f"{type(exc).__name__}: {exc}")

    threads = [
        threading.Thread(target=target, args=(i,), daemon=True, name="colorl-tool") for i in range(len(functions))
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    timed_out = Outcome(error=f"the tool did not answer within {timeout_s:g} s")
    return [timed_out if thread.is_alive() else outcome for thread, outcome in zip(threads, outcomes)]


def tool_result(value: Any) -> tuple[str, float, dict]:
    """(text, step reward, metrics) of what ``execute`` returned: a response (str, ``ToolResponse`` or anything
    with ``.text``) or a tuple (response, reward[, metrics]); ToolResultError for anything else."""
    response, reward, metrics = value, 0.0, {}
    if isinstance(value, tuple):
        if not 1 <= len(value) <= 3:
            raise ToolResultError(f"returned a tuple of {len(value)}; expected (response, reward[, metrics])")
        response, reward, metrics = (*value, 0.0, {})[:3]
    if getattr(response, "image", None) or getattr(response, "video", None):
        raise ToolResultError("returned images or videos; ColoRL's rollout is text-only")
    if hasattr(response, "text") and not isinstance(response, str):
        response = response.text
    response = "" if response is None else response
    if not isinstance(response, str):
        raise ToolResultError(f"returned {type(response).__name__}; expected a str or a ToolResponse")
    reward = 0.0 if reward is None else reward
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise ToolResultError(f"returned the reward {reward!r}; expected a finite number")
    if not isinstance(metrics or {}, dict):
        raise ToolResultError(f"returned metrics of type {type(metrics).__name__}; expected a dict")
    return response, float(reward), dict(metrics or {})


def truncate(text: str, limit: int, side: str) -> str:
    """verl's cut of a long tool response: ``left`` keeps the start, ``right`` the end, ``middle`` both ends."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-half:]
