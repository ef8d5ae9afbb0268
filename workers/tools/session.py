"""Per-trajectory tool state and the execution of one assistant turn's calls, for many trajectories at once.

verl's lifecycle: a tool's instance for a trajectory is created by the first call to that tool, reused by every
later call in the trajectory, and at the trajectory's end ``calc_reward`` is read and the instance released
(``ToolBox.finish``, also after an error). Calls of one turn run at once, on the same instance.

What the model is told, per executed call, is the tool's text, or for a failure ``Error: ...`` naming it: a
malformed call, an unknown tool, a tool that raises, does not answer within ``timeout_s`` or returns something
that is not a tool result. Only the first ``max_parallel_calls`` calls of a turn run (verl drops the rest).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workers.tools.base import BaseTool
from workers.tools.parser import ToolCall
from workers.tools.runner import Outcome, ToolResultError, run_all, tool_result, truncate


@dataclass
class ToolSession:
    """One trajectory's tools: its instances, its ``tools_kwargs`` and what its calls did."""

    tools_kwargs: dict[str, Any] = field(default_factory=dict)
    instances: dict[str, str] = field(default_factory=dict)  # tool name -> instance id
    calls: int = 0
    errors: int = 0
    step_reward: float = 0.0  # Σ of execute's step rewards: added to the outcome reward
    reward_scores: dict[str, float] = field(default_factory=dict)  # calc_reward per tool, at the end

    def kwargs(self, tool: str, stage: str) -> dict[str, Any]:
        """``tools_kwargs[tool][f"{stage}_kwargs"]`` (verl's layout), {} when absent or not a mapping."""
        entry = self.tools_kwargs.get(tool) if isinstance(self.tools_kwargs, dict) else None
        value = entry.get(f"{stage}_kwargs") if isinstance(entry, dict) else None
        return dict(value) if isinstance(value, dict) else {}


def _instance_id(value: Any) -> str:
    """create returns an id, or (id, response) as verl's newer tools do."""
    instance = value[0] if isinstance(value, tuple) and value else value
    if not isinstance(instance, str) or not instance:
        raise ToolResultError(f"create returned {value!r}; expected an instance id (a non-empty str)")
    return instance


@dataclass
class _Pending:
    row: int
    slot: int
    session: ToolSession
    call: ToolCall


class ToolBox:
    """The configured tools and the limits of ``rollout.multi_turn`` that apply to running them."""

    def __init__(self, tools: dict[str, BaseTool], multi_turn: Any) -> None:
        self.tools = tools
        self.schemas = [tool.get_openai_tool_schema().to_dict() for tool in tools.values()]
        self.timeout_s = float(multi_turn.tool_timeout_s)
        self.max_parallel_calls = int(multi_turn.max_parallel_calls)
        self.max_length = int(multi_turn.max_tool_response_length)
        self.truncate_side = str(multi_turn.tool_response_truncate_side)
        self.seconds = 0.0  # wall time spent waiting on tools (timing_s/agent_loop/tool_calls)

    def run_turn(self, turns: list[tuple[ToolSession, list[ToolCall]]]) -> list[list[str]]:
        """Each trajectory's tool messages for its turn's calls (all trajectories' calls at once)."""
        start = time.monotonic()
        texts: list[list[str]] = [[""] * min(len(calls), self.max_parallel_calls) for _, calls in turns]
        pending = []
        for row, (session, calls) in enumerate(turns):
            for slot, call in enumerate(calls[: self.max_parallel_calls]):
                session.calls += 1
                problem = call.error or (
                    None
                    if call.name in self.tools
                    else f"unknown tool {call.name!r}; the tools are {sorted(self.tools)}"
                )
                if problem:
                    session.errors += 1
                    texts[row][slot] = f"Error: {problem}"
                else:
                    pending.append(_Pending(row, slot, session, call))
        failed = self._create_instances(pending)
        runnable = [p for p in pending if (id(p.session), p.call.name) not in failed]
        for p in pending:
            if (id(p.session), p.call.name) in failed:
                p.session.errors += 1
                texts[p.row][p.slot] = f"Error: starting the tool failed: {failed[(id(p.session), p.call.name)]}"
        outcomes = run_all([self._execute(p) for p in runnable], self.timeout_s)
        for p, outcome in zip(runnable, outcomes):
            texts[p.row][p.slot] = self._message(p.session, p.call.name, outcome)
        self.seconds += time.monotonic() - start
        return texts

    def _create_instances(self, pending: list[_Pending]) -> dict[tuple[int, str], str]:
        """Create the instances the pending calls need; (session id, tool) -> error for those that failed."""
        needed = {}
        for p in pending:
            if p.call.name not in p.session.instances:
                needed.setdefault((id(p.session), p.call.name), p.session)
        keys = list(needed)

        def create(session: ToolSession, name: str) -> Callable[[], Any]:
            return lambda: self.tools[name].create(create_kwargs=session.kwargs(name, "create"))

        outcomes = run_all([create(needed[k], k[1]) for k in keys], self.timeout_s)
        failed = {}
        for key, outcome in zip(keys, outcomes):
            try:
                if outcome.error is not None:
                    raise ToolResultError(outcome.error)
                needed[key].instances[key[1]] = _instance_id(outcome.value)
            except ToolResultError as exc:
                failed[key] = str(exc)
        return failed

    def _execute(self, p: _Pending) -> Callable[[], Any]:
        tool, instance = self.tools[p.call.name], p.session.instances[p.call.name]
        kwargs = p.session.kwargs(p.call.name, "execute")
        return lambda: tool.execute(instance, p.call.arguments, **kwargs)

    def _message(self, session: ToolSession, name: str, outcome: Outcome) -> str:
        try:
            if outcome.error is not None:
                raise ToolResultError(outcome.error)
            text, reward, metrics = tool_result(outcome.value)
        except ToolResultError as exc:
            session.errors += 1
            return f"Error: the tool {name!r} failed: {exc}"
        session.step_reward += reward
        session.errors += bool(metrics.get("error"))  # a tool may report a failed call it answered itself
        return truncate(text, self.max_length, self.truncate_side)

    def finish(self, sessions: list[ToolSession]) -> None:
        """calc_reward, then release, of every instance of the finished trajectories (errors counted)."""
        start = time.monotonic()
        owned = [(s, name, instance) for s in sessions for name, instance in s.instances.items()]

        def stage(method: str) -> list[Outcome]:
            return run_all(
                [(lambda s=s, n=n, i=i: getattr(self.tools[n], method)(i, **s.kwargs(n, method))) for s, n, i in owned],
                self.timeout_s,
            )

        for (session, name, _), outcome in zip(owned, stage("calc_reward")):
            value = outcome.value
            valid = (
                outcome.error is None
                and isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
            )
            session.reward_scores[name] = float(value) if valid else 0.0
            session.errors += not valid
        for (session, _, _), outcome in zip(owned, stage("release")):
            session.errors += outcome.error is not None
        for session in sessions:
            session.instances.clear()
        self.seconds += time.monotonic() - start
