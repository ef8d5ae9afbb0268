"""Loading the tools a run names: verl's tool YAML (``multi_turn.tool_config_path``) and function tools
(``multi_turn.function_tool_path``).

The YAML has verl's shape::

    tools:
      - class_name: workers.tools.calculator.CalculatorTool   # or path/to/my_tools.py:MyTool
        config: {type: native}                               # passed to the class; type must be native
        tool_schema: {type: function, function: {name, description, parameters}}   # optional for built-ins

``class_name`` is an importable dotted path or a Python file and a class (``file.py:Class``); verl's own built-in
class names (``verl.tools.gsm8k_tool.Gsm8kTool``) map to ColoRL's. Naming a class or a file **runs that code**
in the driver (to check it) and in every rollout worker, as ``reward.custom_reward_function`` does. A function-tool
file holds plain functions marked with ``@function_tool``; their schema comes from their signature and
docstring (``transformers.utils.get_json_schema``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import yaml

from workers.tools.base import BaseTool, ToolConfigError, ToolResponse, ToolSchema

# verl's built-in tool classes -> ColoRL's, so verl's example tool configs load unchanged
VERL_CLASSES = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "workers.tools.answer.AnswerTool",
}
_MARK = "__colorl_function_tool__"


def _import_file(path: str) -> Any:
    if not os.path.isfile(path):
        raise ToolConfigError(f"{path!r}: no such Python file")
    name = f"colorl_tools_{abs(hash(os.path.abspath(path)))}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise ToolConfigError(f"importing {path!r} raised {type(exc).__name__}: {exc}") from None
        sys.modules[name] = module
    return sys.modules[name]


def load_class(spec: str) -> type:
    """The class ``spec`` names: ``package.module.Class`` or ``path/to/file.py:Class``."""
    spec = VERL_CLASSES.get(spec, spec)
    if ".py:" in spec:
        path, _, name = spec.rpartition(":")
        module = _import_file(path)
    else:
        module_name, _, name = spec.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise ToolConfigError(
                f"class_name {spec!r}: cannot import {module_name!r} ({type(exc).__name__}: "
                f"{exc}); use an importable module or path/to/file.py:ClassName"
            ) from None
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ToolConfigError(f"class_name {spec!r}: {module.__name__!r} has no class {name!r}")
    return cls


def _tool_from_entry(entry: Any, where: str) -> BaseTool:
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
        raise ToolConfigError(f"{where}: each entry needs a class_name (and optionally config, tool_schema)")
    config = entry.get("config") or {}
    kind = config.get("type", "native") if isinstance(config, dict) else None
    if kind != "native":
        raise ToolConfigError(f"{where}.config.type={kind!r}: only native tools are supported (MCP is not)")
    schema = entry.get("tool_schema")
    schema = None if schema is None else ToolSchema.from_dict(schema, f"{where}.tool_schema")
    try:
        tool = load_class(entry["class_name"])(config=config, tool_schema=schema)
    except ToolConfigError as exc:
        raise ToolConfigError(f"{where}: {exc}") from None
    except Exception as exc:  # the user's constructor
        raise ToolConfigError(
            f"{where}: {entry['class_name']}(config, tool_schema) raised {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(tool, BaseTool):
        raise ToolConfigError(f"{where}: {entry['class_name']} is not a subclass of workers.tools.BaseTool")
    return tool


def load_tool_config(path: str) -> list[BaseTool]:
    """The tools of a verl tool YAML."""
    if not os.path.isfile(path):
        raise ToolConfigError(f"{path!r}: no such tool config file")
    try:
        with open(path) as f:
            document = yaml.safe_load(f) or {}
    except yaml.YAMLError as exc:
        raise ToolConfigError(f"{path!r} is not valid YAML: {str(exc).splitlines()[0]}") from None
    entries = document.get("tools") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ToolConfigError(f"{path!r}: expected a top-level 'tools:' list")
    return [_tool_from_entry(entry, f"{path}: tools[{i}]") for i, entry in enumerate(entries)]


def function_tool(function: Callable | None = None, name: str | None = None, schema: dict | None = None) -> Any:
    """Mark a function as a tool: ``@function_tool``, ``@function_tool("name")`` or ``@function_tool(schema=...)``."""
    if isinstance(function, str):
        function, name = None, function

    def mark(fn: Callable) -> Callable:
        setattr(fn, _MARK, (name or fn.__name__, schema))
        return fn

    return mark(function) if function is not None else mark


class FunctionTool(BaseTool):
    """A ``@function_tool`` function as a stateless tool: each call is ``function(**arguments)``."""

    def __init__(self, function: Callable, name: str, schema: dict | None) -> None:
        if schema is None:
            from transformers.utils import get_json_schema  # its docstring parser gives the parameters

            try:
                schema = get_json_schema(function)
            except Exception as exc:
                raise ToolConfigError(
                    f"function tool {function.__name__!r}: {exc} (give it type hints and a "
                    "docstring with Args:, or pass schema=)"
                ) from None
        schema = dict(schema, function=dict(schema.get("function", {}), name=name))
        super().__init__({}, schema)
        self.function = function

    def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> Any:
        result = self.function(**parameters)
        return _json_text(result) if not hasattr(result, "__await__") else self._later(result)

    @staticmethod
    async def _later(result: Any) -> Any:
        return _json_text(await result)


def _json_text(result: Any) -> Any:
    return ToolResponse(text=json.dumps(result)) if isinstance(result, dict) else result


def load_function_tools(path: str) -> list[BaseTool]:
    """A ``FunctionTool`` for every ``@function_tool`` function in the Python file ``path``."""
    module = _import_file(path)
    marked = [value for value in vars(module).values() if callable(value) and hasattr(value, _MARK)]
    if not marked:
        raise ToolConfigError(f"{path!r} has no @function_tool functions (from workers.tools import function_tool)")
    return [FunctionTool(fn, *getattr(fn, _MARK)) for fn in marked]


def load_tools(tool_config_path: str | None, function_tool_path: str | None) -> dict[str, BaseTool]:
    """Name -> tool of both sources; the same name twice is an error. ToolConfigError.key names the source."""
    tools: list[BaseTool] = []
    for key, path, load in (
        ("tool_config_path", tool_config_path, load_tool_config),
        ("function_tool_path", function_tool_path, load_function_tools),
    ):
        try:
            tools += load(path) if path else []
        except ToolConfigError as exc:
            raise ToolConfigError(str(exc), key) from None
    by_name: dict[str, BaseTool] = {}
    for tool in tools:
        if tool.name in by_name:
            raise ToolConfigError(
                f"two tools are named {tool.name!r} (tool_config_path={tool_config_path}, "
                f"function_tool_path={function_tool_path})",
                "tool_config_path",
            )
        by_name[tool.name] = tool
    return by_name
