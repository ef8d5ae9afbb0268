"""The tool interface: a tool object serves many trajectories, each call through an instance.

For every call the agent loop runs ``create(create_kwargs=...)`` (the row's
``tools_kwargs[name]["create_kwargs"]``), ``execute(instance_id, parameters, agent_data=...)`` and, whatever
happened, ``release(instance_id)``. ColoRL also reads ``calc_reward(instance_id)`` after a successful
``execute`` (before ``release``): the tool's score for the trajectory is its last call's
(``extra_info["rollout_reward_scores"][name]``). State that must outlive one call goes in
``agent_data.extra_fields``. Every method may be ``async def`` or a plain
``def``; they run on the worker's one event loop (``workers.tools.runner``).

A tool's schema is OpenAI's function-tool schema, as in the tool YAML::

    {"type": "function", "function": {"name": "calculator", "description": "...",
     "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": [...]}}}

The schema classes answer to the part of pydantic's surface that tool code uses (``model_validate``,
``model_dump``, keyword construction), so tool code written against pydantic schema classes runs on them; the door
package serves them under other libraries' names (docs/tools.md).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, fields
from typing import Any

from config.checks import ConfigError


class ToolConfigError(ConfigError):
    """A tool configuration or tool class cannot be used (a user's mistake, so a ``ConfigError``); the message names
    the file and the fix, ``key`` the ``rollout.multi_turn`` key whose value is at fault (when known)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class _Model:
    """``model_validate`` / ``model_dump`` over a dataclass (the pydantic calls tool code makes)."""

    @classmethod
    def model_validate(cls, value: Any) -> Any:
        if isinstance(value, cls):
            return value
        return cls._parse(as_dict(value), cls.__name__)

    @classmethod
    def _parse(cls, value: dict, where: str) -> Any:
        return cls(**{f.name: value[f.name] for f in fields(cls) if f.name in value})

    def model_dump(self, *, exclude_unset: bool = False, exclude_none: bool = False, **_: Any) -> dict[str, Any]:
        """A dict of the fields; ``exclude_unset`` drops ``strict: false`` (the one optional flag here)."""
        out = {}
        for f in fields(self):
            value = _plain(getattr(self, f.name))
            if (exclude_none and value is None) or (exclude_unset and f.name == "strict" and not value):
                continue
            out[f.name] = value
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, _Model):
        return value.model_dump(exclude_unset=True, exclude_none=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def as_dict(schema: Any) -> Any:
    """A schema as a plain dict: ColoRL's, a pydantic one (``model_dump``) or a mapping (e.g. from YAML)."""
    if hasattr(schema, "model_dump"):
        return schema.model_dump(exclude_unset=True, exclude_none=True)
    return dict(schema) if isinstance(schema, dict) else schema


@dataclass
class ToolResponse(_Model):
    """What a tool call returns to the model: text (ColoRL's rollout is text-only; images are refused)."""

    text: str | None = None
    image: list | None = None
    video: list | None = None

    def is_empty(self) -> bool:
        return not self.text and not self.image and not self.video

    def is_text_only(self) -> bool:
        return bool(self.text) and not self.image and not self.video


@dataclass
class PropertySchema(_Model):
    """One parameter of a function's schema."""

    type: str | list[str]
    description: str | None = None
    enum: list | None = None


@dataclass
class ParametersSchema(_Model):
    """A function's parameters; ``properties`` may hold any JSON
    schema per parameter (dicts are kept whole) or ``PropertySchema`` objects."""

    type: str = "object"
    properties: dict[str, Any] = field(default_factory=dict)
    required: list[str] = field(default_factory=list)


@dataclass
class FunctionSchema(_Model):
    """A function: its name, description and parameters."""

    name: str
    description: str = ""
    parameters: ParametersSchema = field(default_factory=ParametersSchema)
    strict: bool = False


@dataclass
class ToolSchema(_Model):
    """OpenAI's function-tool schema; ``model_dump`` is what the chat
    template receives (``tools=``)."""

    type: str
    function: FunctionSchema

    @classmethod
    def from_dict(cls, schema: Any, where: str = "tool_schema") -> ToolSchema:
        """Parse and check a schema; ToolConfigError names ``where`` and the missing or wrong part."""
        return cls.model_validate(schema) if isinstance(schema, cls) else cls._parse(as_dict(schema), where)

    @classmethod
    def _parse(cls, schema: Any, where: str) -> ToolSchema:
        function = schema.get("function") if isinstance(schema, dict) else None
        if not isinstance(function, dict):
            raise ToolConfigError(
                f"{where}: expected {{type: function, function: {{name, description, parameters}}}}, got {schema!r}"
            )
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ToolConfigError(f"{where}.function.name: a non-empty string is required, got {name!r}")
        parameters = as_dict(function.get("parameters") or {})
        if not isinstance(parameters, dict) or not isinstance(parameters.get("properties", {}), dict):
            raise ToolConfigError(
                f"{where}.function.parameters: expected a JSON-schema object with 'properties', got {parameters!r}"
            )
        return cls(
            str(schema.get("type", "function")),
            FunctionSchema(
                name,
                str(function.get("description") or ""),
                ParametersSchema(
                    str(parameters.get("type", "object")),
                    dict(parameters.get("properties") or {}),
                    list(parameters.get("required") or []),
                ),
                bool(function.get("strict", False)),
            ),
        )


class BaseTool:
    """Subclass and override ``execute`` (and ``create``/``calc_reward``/``release`` for per-call state).

    ``config`` is the ``config:`` mapping of the tool's YAML entry; ``tool_schema`` its ``tool_schema:`` (a dict,
    a ``ToolSchema`` or a family's pydantic schema, ``workers.tools.registry.ToolFamily``), or None: then the
    class's ``default_schema``, else what the class's ``get_openai_tool_schema()`` returns (a schema built in code).
    """

    default_schema: dict | None = None

    def __init__(self, config: dict, tool_schema: Any = None) -> None:
        self.config = config if isinstance(config, dict) else dict(config or {})
        schema = tool_schema if tool_schema is not None else self.default_schema
        if schema is None:
            schema = self.get_openai_tool_schema()
        if schema is None:
            raise ToolConfigError(
                f"{type(self).__name__}: no tool_schema in the config, no default_schema and "
                "get_openai_tool_schema() returned None"
            )
        self.tool_schema = ToolSchema.from_dict(schema, f"{type(self).__name__} tool_schema")
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> ToolSchema | None:
        return getattr(self, "tool_schema", None)

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Start an instance for one call; ``create_kwargs`` comes from the row's ``tools_kwargs``."""
        return instance_id or uuid.uuid4().hex, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> Any:
        """One call (``agent_data`` in kwargs): ``(ToolResponse | str, step_reward, metrics)`` or the response."""
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The tool's score for the trajectory after this call (``extra_info["rollout_reward_scores"][name]``)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the instance's state."""
