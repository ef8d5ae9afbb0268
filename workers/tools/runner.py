"""Running tools' code without letting it end the run: one event loop per worker, deadlines, checked results.

Every tool call of a worker runs on one asyncio event loop that lives for the worker's lifetime, in a daemon
thread (``ToolLoop``): the decode loop (synchronous torch code) hands it the calls of all trajectories whose
turns ended at the same step and waits for them. One loop for all of them, so a tool may keep
loop-bound state across calls (an ``asyncio.Lock``, a client session). An ``async def`` method is awaited on
the loop; a plain ``def`` one runs in a thread of its own, so a blocking tool never holds up the loop.

Each method call gets ``timeout_s`` (``asyncio.wait_for``): an awaiting tool is cancelled, a blocking ``def``
tool's thread is abandoned (a thread cannot be stopped from outside; it is a daemon). Either way only that call
ends, with an error message for the model. The caller also waits at most ``stages * timeout_s`` plus a second
for the whole batch: an ``async def`` tool that blocks the loop itself (``time.sleep`` without ``await``)
stalls every call on it, so at that deadline the pending calls end with the timeout message and the worker
moves to a fresh loop (state bound to the old one, such as a held lock, is lost).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Outcome:
    value: Any = None
    error: str | None = None  # None: the call returned ``value``


class ToolResultError(ValueError):
    """A tool returned something that is not a tool result."""


class ToolTimeout(Exception):
    """A tool method did not answer within ``timeout_s``."""


async def call_tool_method(function: Callable[..., Any], timeout_s: float, *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` on the running loop within ``timeout_s``: awaited when it is async, in a
    daemon thread of its own when it is not (a returned awaitable is awaited too). ToolTimeout past the
    deadline; the method's own exception otherwise."""

    async def run() -> Any:
        if inspect.iscoroutinefunction(function):
            result = await function(*args, **kwargs)
        else:
            result = await in_thread(lambda: function(*args, **kwargs))
        return await result if inspect.isawaitable(result) else result

    try:
        return await asyncio.wait_for(run(), timeout_s)
    except TimeoutError:
        raise ToolTimeout(f"the tool did not answer within {timeout_s:g} s") from None


def in_thread(function: Callable[[], Any]) -> asyncio.Future:
    """An asyncio future of ``function()`` run in a new daemon thread (a hung one never blocks another call)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value: Any = None, error: BaseException | None = None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(value)

    def target() -> None:
        try:
            value = function()
        except BaseException as exc:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, value)

    threading.Thread(target=target, daemon=True, name="colorl-tool-call").start()
    return future


class ToolLoop:
    """The worker's event loop for tools, in a daemon thread; ``run`` takes coroutine factories and blocks."""

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="colorl-tools").start()

    def run(self, calls: list[Callable[[], Awaitable[Any]]], deadline_s: float) -> list[Outcome]:
        """Each call's value or error message, all started at once; at ``deadline_s`` the unfinished ones end
        with a timeout message and this loop is replaced (a tool is blocking it)."""
        futures = [asyncio.run_coroutine_threadsafe(_outcome(call), self.loop) for call in calls]
        _, pending = concurrent.futures.wait(futures, timeout=deadline_s)
        if pending:
            for future in pending:
                future.cancel()
            self.loop.call_soon_threadsafe(self.loop.stop)  # takes effect once the blocking tool returns
            self._start()
        late = Outcome(error=f"the tool did not answer within {deadline_s:g} s (its event loop was blocked)")
        return [late if future in pending else future.result() for future in futures]


async def _outcome(call: Callable[[], Awaitable[Any]]) -> Outcome:
    try:
        return Outcome(value=await call())
    except Exception as exc:  # the tool's own failure: reported to the model, never raised here
        own = isinstance(exc, (ToolTimeout, ToolResultError))  # ColoRL's messages say what happened already
        return Outcome(error=str(exc) if own else f"{type(exc).__name__}: {exc}")


_LOOP: ToolLoop | None = None
_LOCK = threading.Lock()


def tool_loop() -> ToolLoop:
    """This process's tool event loop (started at the first use)."""
    global _LOOP
    with _LOCK:
        if _LOOP is None:
            _LOOP = ToolLoop()
        return _LOOP


def tool_result(value: Any) -> tuple[str, float, dict]:
    """(text, step reward, metrics) of what ``execute`` returned: a response (str, ``ToolResponse`` or anything
    with ``.text``) or a tuple (response, reward[, metrics]); ToolResultError for anything else. The reward is a
    finite number or a bool (``False`` is 0.0, ``True`` 1.0); ``None`` is 0.0."""
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
    if not isinstance(reward, (int, float)) or not math.isfinite(reward):  # a bool is an int: its 0 or 1
        raise ToolResultError(f"returned the reward {reward!r}; expected a finite number")
    if not isinstance(metrics or {}, dict):
        raise ToolResultError(f"returned metrics of type {type(metrics).__name__}; expected a dict")
    return response, float(reward), dict(metrics or {})


def truncate(text: str, limit: int, side: str) -> str:
    """The cut of a long tool response (``multi_turn.tool_response_truncate_side``): ``left`` drops the start
    (keeps the end), ``right`` drops the end, ``middle`` keeps both ends."""
    if len(text) <= limit:
        return text
    if side == "left":
        return "(truncated)..." + text[-limit:]
    if side == "right":
        return text[:limit] + "...(truncated)"
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-half:]
