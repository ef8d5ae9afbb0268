"""One trajectory's record (``AgentData``) and the execution of assistant turns' calls, many at once.

A tool's lifecycle, per call: ``create(create_kwargs=tools_kwargs[name]["create_kwargs"])``,
``execute(instance_id, arguments, agent_data=agent_data)``, then ``release(instance_id)`` whatever happened;
ColoRL reads ``calc_reward(instance_id)`` between the last two (``workers.tools.base``). A ``@function_tool``
function has no lifecycle: it is called with the arguments. Every call of a turn, of every trajectory whose turn
ended at the same decoding step, runs at once on the worker's event loop (``workers.tools.runner``).

What the model is told, per executed call, is the tool's text, or for a failure ``Error: ...`` naming it: a
malformed call, an unknown tool, a tool that raises, does not answer within ``timeout_s`` or returns something
that is not a tool result. Only the first ``max_parallel_calls`` calls of a turn run (the rest are dropped).
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from workers.tools.base import as_dict
from workers.tools.parser import ToolCall
from workers.tools.runner import ToolResultError, call_tool_method, tool_loop, tool_result, truncate

STAGES = 4  # create, execute, calc_reward, release: the most timeouts one call can take


@dataclass
class AgentData:
    """A trajectory as tools see it (``execute(..., agent_data=...)``), with ColoRL's
    counters. ``prompt_ids`` is the running token stream (prompt, then every turn's ids as fed to the model),
    ``response_mask`` 1 on the model's sampled tokens and 0 on tool turns, ``response_ids`` the last assistant
    turn's sampled ids; ``extra_fields`` is the tools' place for state across calls."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    tools_kwargs: dict[str, Any] = field(default_factory=dict)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    metrics: dict[str, Any] = field(default_factory=dict)
    extra_fields: dict[str, Any] = field(default_factory=dict)
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    tool_rewards: list[float] = field(default_factory=list)  # each executed call's step reward
    turn_scores: list[float] = field(default_factory=list)
    user_turns: int = 0  # tool-response turns (counted as user turns)
    assistant_turns: int = 0
    tool_calls: list[ToolCall] = field(default_factory=list)  # the last assistant turn's calls
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)
    call_count: int = 0
    error_count: int = 0
    reward_scores: dict[str, float] = field(default_factory=dict)  # calc_reward per tool, after its last call

    def kwargs(self, tool: str, stage: str) -> dict[str, Any]:
        """``tools_kwargs[tool][f"{stage}_kwargs"]`` (the dataset's layout), {} when absent or not a mapping."""
        entry = self.tools_kwargs.get(tool) if isinstance(self.tools_kwargs, dict) else None
        value = entry.get(f"{stage}_kwargs") if isinstance(entry, dict) else None
        return dict(value) if isinstance(value, dict) else {}


def schema_of(tool: Any) -> dict[str, Any]:
    """A tool's schema as the chat template receives it (``model_dump(exclude_unset, exclude_none)``)."""
    return as_dict(tool.tool_schema)


def _instance_id(value: Any) -> str:
    """create returns (id, response), or just an id."""
    instance = value[0] if isinstance(value, tuple) and value else value
    if not isinstance(instance, str) or not instance:
        raise ToolResultError(f"create returned {value!r}; expected (instance_id, ToolResponse) or an id")
    return instance


class ToolBox:
    """The configured tools and the limits of ``rollout.multi_turn`` that apply to running them."""

    def __init__(self, tools: dict[str, Any], multi_turn: Any) -> None:
        self.tools = tools
        self.schemas = [schema_of(tool) for tool in tools.values()]
        self.timeout_s = float(multi_turn.tool_timeout_s)
        self.max_parallel_calls = int(multi_turn.max_parallel_calls)
        self.max_length = int(multi_turn.max_tool_response_length)
        self.truncate_side = str(multi_turn.tool_response_truncate_side)
        self.seconds = 0.0  # wall time spent waiting on tools (timing_s/agent_loop/tool_calls)

    def run_turn(self, turns: list[tuple[AgentData, list[ToolCall]]]) -> list[list[str]]:
        """Each trajectory's tool messages for its turn's calls (all trajectories' calls at once)."""
        start = time.monotonic()
        texts: list[list[str]] = [[""] * min(len(calls), self.max_parallel_calls) for _, calls in turns]
        runnable = []
        for row, (agent_data, calls) in enumerate(turns):
            for slot, call in enumerate(calls[: self.max_parallel_calls]):
                agent_data.call_count += 1
                problem = call.error or (
                    None
                    if call.name in self.tools
                    else f"unknown tool {call.name!r}; the tools are {sorted(self.tools)}"
                )
                if problem:
                    agent_data.error_count += 1
                    texts[row][slot] = f"Error: {problem}"
                else:
                    runnable.append((row, slot, agent_data, call))
        outcomes = tool_loop().run(
            [lambda a=agent_data, c=call: self._call(a, c) for _, _, agent_data, call in runnable],
            STAGES * self.timeout_s + 1.0,
        )
        for (row, slot, agent_data, call), outcome in zip(runnable, outcomes):
            if outcome.error is not None:
                agent_data.error_count += 1
                texts[row][slot] = f"Error: the tool {call.name!r} failed: {outcome.error}"
            else:
                texts[row][slot] = truncate(outcome.value, self.max_length, self.truncate_side)
        self.seconds += time.monotonic() - start
        return texts

    async def _call(self, agent_data: AgentData, call: ToolCall) -> str:
        """One call's text; raises (the message's reason) when the call failed."""
        tool, timeout = self.tools[call.name], self.timeout_s
        if getattr(tool, "stateless", False):  # a function tool: no lifecycle
            text, reward, metrics = tool_result(await call_tool_method(tool.execute, timeout, "", call.arguments))
            return self._record(agent_data, reward, metrics, text)
        created = await call_tool_method(tool.create, timeout, create_kwargs=agent_data.kwargs(call.name, "create"))
        instance = _instance_id(created)
        try:
            result = await call_tool_method(tool.execute, timeout, instance, call.arguments, agent_data=agent_data)
            text, reward, metrics = tool_result(result)
            await self._score(agent_data, tool, call.name, instance)
        finally:
            try:
                await call_tool_method(tool.release, timeout, instance)
            except Exception:  # the call's answer stands; a failed release is counted
                agent_data.error_count += 1
        return self._record(agent_data, reward, metrics, text)

    async def _score(self, agent_data: AgentData, tool: Any, name: str, instance: str) -> None:
        """The tool's calc_reward after this call; a failure or a non-number counts as an error and scores 0."""
        try:
            score = await call_tool_method(tool.calc_reward, self.timeout_s, instance)
        except Exception:
            score = None
        valid = isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score)
        agent_data.reward_scores[name] = float(score) if valid else 0.0
        agent_data.error_count += not valid

    @staticmethod
    def _record(agent_data: AgentData, reward: float, metrics: dict, text: str) -> str:
        agent_data.tool_rewards.append(reward)
        agent_data.error_count += bool(metrics.get("error"))  # a tool may report a failed call it answered
        return text
