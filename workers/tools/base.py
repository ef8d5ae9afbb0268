"""The tool interface in verl's shape: a tool object serves many trajectories, each through its own instance.

For each trajectory that calls it, the agent loop calls ``create`` once (at the first call), ``execute`` for
every call, and at the trajectory's end ``calc_reward`` then ``release`` (also when the trajectory ended with
an error). Every method may be a plain ``def`` or an ``async def`` (verl's tools are async: a ported one runs
as it is); each call runs in its own thread under ``multi_turn.tool_timeout_s`` (``workers.tools.runner``).

A tool's schema is OpenAI's function-tool schema, as in verl's tool YAML::

    {"type": "function", "function": {"name": "calculator", "description": "...",
     "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": [...]}}}
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from config.checks import ConfigError


class ToolConfigError(ConfigError):
    """A tool configuration or tool class cannot be used (a user's mistake, so a ``ConfigError``); the message names
    the file and the fix, ``key`` the ``rollout.multi_turn`` key whose value is at fault (when known)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


@dataclass
class ToolResponse:
    """What a tool call returns to the model: text (ColoRL's rollout is text-only; images are refused)."""

    text: str | None = None
    image: list | None = None
    video: list | None = None


@dataclass(frozen=True)
class FunctionSchema:
    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}, "required": []})


@dataclass(frozen=True)
class ToolSchema:
    """OpenAI's function-tool schema; ``to_dict`` is what the chat template receives (``tools=``)."""

    function: FunctionSchema
    type: str = "function"

    @classmethod
    def from_dict(cls, schema: Any, where: str = "tool_schema") -> ToolSchema:
        """Parse and check a schema dict; ToolConfigError names ``where`` and the missing or wrong part."""
        if not isinstance(schema, dict) or not isinstance(schema.get("function"), dict):
            raise ToolConfigError(
                f"{where}: expected {{type: function, function: {{name, description, parameters}}}}, got {schema!r}"
            )
        function = schema["function"]
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ToolConfigError(f"{where}.function.name: a non-empty string is required, got {name!r}")
        parameters = function.get("parameters") or {"type": "object", "properties": {}, "required": []}
        if not isinstance(parameters, dict) or not isinstance(parameters.get("properties", {}), dict):
            raise ToolConfigError(
                f"{where}.function.parameters: expected a JSON-schema object with 'properties', got {parameters!r}"
            )
        return cls(
            FunctionSchema(name, str(function.get("description") or ""), parameters),
            str(schema.get("type", "function")),
        )

    def to_dict(self) -> dict[str, Any]:
        f = self.function
        return {
            "type": self.type,
            "function": {"name": f.name, "description": f.description, "parameters": f.parameters},
        }


class BaseTool:
    """Subclass and override ``execute`` (and ``create``/``calc_reward``/``release`` for per-trajectory state).

    ``config`` is the ``config:`` mapping of the tool's YAML entry; ``tool_schema`` its ``tool_schema:`` (a
    dict or a ``ToolSchema``), or None to use the class's ``default_schema``.
    """

    default_schema: dict | None = None

    def __init__(self, config: dict, tool_schema: ToolSchema | dict | None = None) -> None:
        self.config = dict(config or {})
        schema = tool_schema if tool_schema is not None else self.default_schema
        if schema is None:
            raise ToolConfigError(f"{type(self).__name__}: no tool_schema in the config and no default_schema")
        self.tool_schema = schema if isinstance(schema, ToolSchema) else ToolSchema.from_dict(schema)
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> ToolSchema:
        return self.tool_schema

    def create(self, instance_id: str | None = None, **kwargs: Any) -> str | tuple[str, ToolResponse]:
        """Start this tool's state for one trajectory; ``create_kwargs`` comes from the row's ``tools_kwargs``."""
        return instance_id or uuid.uuid4().hex

    def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> Any:
        """One call: returns ``(ToolResponse | str, step_reward, metrics)`` (or just the response)."""
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The tool's final reward for the trajectory (``extra_info["rollout_reward_scores"][name]``)."""
        return 0.0

    def release(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the trajectory's state."""
