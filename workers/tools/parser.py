"""Hermes tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in an assistant turn's text.

A call that cannot be decoded is not dropped (which would end the trajectory as if the model had answered):
every attempted call is kept: a malformed one becomes a ``ToolCall`` with ``error`` set, which the agent loop
turns into the tool's message, so the model sees what was wrong. An opening tag without a closing one (the
turn ended inside the call) is malformed too. ``arguments`` may be an object or a JSON string of one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

START, END = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(START) + r"(.*?)(" + re.escape(END) + r"|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str  # "" when the call could not be parsed
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the call is malformed; None for a well-formed call


def _parse_one(body: str, closed: bool) -> ToolCall:
    if not closed:
        return ToolCall("", error=f"the tool call is not closed with {END}")
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall("", error=f"the tool call is not valid JSON ({exc.msg} at character {exc.pos})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCall("", error='a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(call["name"], error="the tool call's arguments must be a JSON object")
    return ToolCall(call["name"], arguments)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every call the text attempts, in order (empty when it has no ``<tool_call>``: an answer)."""
    return [_parse_one(m.group(1).strip(), bool(m.group(2))) for m in _CALL.finditer(text)]
