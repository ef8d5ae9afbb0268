"""Loading the tools a run names: verl's tool YAML (``multi_turn.tool_config_path``) and function tools
(``multi_turn.function_tool_path``).

The YAML has verl's shape::

    tools:
      - class_name: workers.tools.calculator.CalculatorTool   # or path/to/my_tools.py:MyTool
        config: {type: native}                               # passed to the class; type must be native
        tool_schema: {type: function, function: {name, description, parameters}}   # optional

``class_name`` is an importable dotted path or a Python file and a class (``file.py:Class``); verl's own former
built-in ``verl.tools.gsm8k_tool.Gsm8kTool`` maps to ColoRL's answer tool. The class may subclass ColoRL's
``workers.tools.BaseTool`` or verl's ``verl.tools.base_tool.BaseTool``: a file importing ``verl.*`` gets verl's
classes where verl is installed and ColoRL's otherwise (the modules ``COLORL_PRELOAD`` names serve them); a verl
class gets verl's schema object. Without ``tool_schema`` the class's own schema is used (``default_schema`` or what
``get_openai_tool_schema()`` returns). A function-tool file holds functions marked with ``@function_tool``
(ColoRL's, or verl's ``verl.tools.function_tool.function_tool``); their schema comes from their signature and
docstring (``transformers.utils.get_json_schema``). Naming a class or a file **runs that code** in the driver
(to check it) and in every rollout worker, as ``reward.custom_reward_function`` does.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import yaml

from workers.tools.base import BaseTool, ToolConfigError, ToolResponse, ToolSchema
from workers.tools.runner import in_thread

# verl's former built-in tool classes -> ColoRL's, so verl's example tool configs load unchanged
VERL_CLASSES = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "workers.tools.answer.AnswerTool",
}
_MARK = "__colorl_function_tool__"
# Modules imported before a user's file runs (comma-separated): they may make names importable that the user's file
# imports (main.py names the door to verl's module paths; Ray workers inherit the variable)
PRELOAD = "COLORL_PRELOAD"


def _preload() -> None:
    for name in filter(None, os.environ.get(PRELOAD, "").split(",")):
        importlib.import_module(name.strip())


def _installed_module(name: str) -> Any:
    """Module ``name`` if a user's file imported it from its own package; None if not imported, or if another
    package serves it under that name (its module keeps its own ``__name__``)."""
    module = sys.modules.get(name)
    return module if module is not None and module.__name__ == name else None


def _import_file(path: str) -> Any:
    _preload()
    if not os.path.isfile(path):
        raise ToolConfigError(f"{path!r}: no such Python file")
    name = f"colorl_tools_{abs(hash(os.path.abspath(path)))}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # a dataclass or a pickled object in the file looks its module up
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise ToolConfigError(f"importing {path!r} raised {type(exc).__name__}: {exc}") from None
    return sys.modules[name]


def load_class(spec: str) -> type:
    """The class ``spec`` names: ``package.module.Class`` or ``path/to/file.py:Class``."""
    spec = VERL_CLASSES.get(spec, spec)
    if ".py:" in spec:
        path, _, name = spec.rpartition(":")
        module = _import_file(path)
    else:
        _preload()
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


def _schema_for(cls: type, schema: dict | None, where: str) -> Any:
    """The schema object ``cls`` takes: ColoRL's ``ToolSchema``, or verl's for a subclass of verl's BaseTool."""
    if schema is None:
        return None
    verl_base = _installed_module("verl.tools.base_tool")
    if verl_base is not None and issubclass(cls, verl_base.BaseTool):
        schemas = sys.modules["verl.tools.schemas"]
        try:
            return schemas.OpenAIFunctionToolSchema.model_validate(schema)
        except Exception as exc:  # pydantic's validation error, first line
            raise ToolConfigError(f"{where}.tool_schema: {str(exc).splitlines()[0]} ({schema!r})") from None
    return ToolSchema.from_dict(schema, f"{where}.tool_schema")


def _is_tool(tool: Any) -> bool:
    verl_base = _installed_module("verl.tools.base_tool")
    kinds = (BaseTool,) + ((verl_base.BaseTool,) if verl_base is not None else ())
    return isinstance(tool, kinds) and isinstance(getattr(tool, "name", None), str)


def _tool_from_entry(entry: Any, where: str) -> Any:
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
        raise ToolConfigError(f"{where}: each entry needs a class_name (and optionally config, tool_schema)")
    config = entry.get("config") or {}
    kind = config.get("type", "native") if isinstance(config, dict) else None
    if kind != "native":
        raise ToolConfigError(f"{where}.config.type={kind!r}: only native tools are supported (MCP is not)")
    cls = load_class(entry["class_name"])
    schema = _schema_for(cls, entry.get("tool_schema"), where)
    try:
        tool = cls(config=dict(config), tool_schema=schema)
    except ToolConfigError as exc:
        raise ToolConfigError(f"{where}: {exc}") from None
    except Exception as exc:  # the user's constructor (or verl's BaseTool finding no schema)
        raise ToolConfigError(
            f"{where}: {entry['class_name']}(config, tool_schema) raised {type(exc).__name__}: {exc}"
        ) from None
    if not _is_tool(tool):
        raise ToolConfigError(
            f"{where}: {entry['class_name']} is not a subclass of workers.tools.BaseTool "
            "(or of verl.tools.base_tool.BaseTool)"
        )
    return tool


def load_tool_config(path: str) -> list[Any]:
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


def function_tool(name: str | Callable | None = None, *, schema: Any = None) -> Any:
    """Mark a function as a tool, as verl's decorator does: ``@function_tool``, ``@function_tool("name")`` or
    ``@function_tool(schema=...)`` (a dict or a schema object; otherwise built from the signature and docstring)."""
    if callable(name):
        return function_tool(schema=schema)(name)

    def mark(fn: Callable) -> Callable:
        setattr(fn, _MARK, (name or fn.__name__, schema))
        return fn

    return mark


class FunctionTool(BaseTool):
    """A ``@function_tool`` function as a stateless tool (no create/release): each call is
    ``function(**arguments)`` (a plain function in a thread of its own), its value read by ``function_result``."""

    stateless = True

    def __init__(self, function: Callable, name: str, schema: Any) -> None:
        if schema is None:
            from transformers.utils import get_json_schema  # its docstring parser gives the parameters

            try:
                schema = get_json_schema(function)
            except Exception as exc:
                raise ToolConfigError(
                    f"function tool {function.__name__!r}: {exc} (give it type hints and a "
                    "docstring with Args:, or pass schema=)"
                ) from None
        schema = ToolSchema.from_dict(schema, f"function tool {name!r}")
        schema.function.name = name
        super().__init__({}, schema)
        self.function = function

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> Any:
        if inspect.iscoroutinefunction(self.function):
            return function_result(await self.function(**parameters))
        return function_result(await in_thread(lambda: self.function(**parameters)))


def function_result(value: Any) -> Any:
    """verl's reading of a function tool's return value: a ``ToolResponse`` or a str as it is, a dict as its JSON,
    a tuple as (response, reward[, metrics]) with the response read the same way, anything else as its str."""
    if isinstance(value, tuple):
        return (function_result(value[0]), *value[1:]) if value else value
    if isinstance(value, dict):
        return ToolResponse(text=json.dumps(value, ensure_ascii=False))
    return value if isinstance(value, (str, ToolResponse)) or hasattr(value, "text") else ToolResponse(text=str(value))


def _verl_function_tools(module: Any) -> list[BaseTool]:
    """The functions of ``module`` registered with the real verl's ``@function_tool`` (verl keeps a registry)."""
    verl_functions = _installed_module("verl.tools.function_tool")
    registry = getattr(verl_functions, "FUNCTION_TOOL_REGISTRY", {}) if verl_functions else {}
    return [
        FunctionTool(entry.fn, entry.name, entry.tool_schema)
        for entry in registry.values()
        if getattr(entry.fn, "__module__", None) == module.__name__
    ]


def load_function_tools(path: str) -> list[BaseTool]:
    """A ``FunctionTool`` for every ``@function_tool`` function in the Python file ``path``."""
    module = _import_file(path)
    marked = [value for value in vars(module).values() if callable(value) and hasattr(value, _MARK)]
    tools = [FunctionTool(fn, *getattr(fn, _MARK)) for fn in marked] + _verl_function_tools(module)
    if not tools:
        raise ToolConfigError(f"{path!r} has no @function_tool functions (from workers.tools import function_tool)")
    return tools


def load_tools(tool_config_path: str | None, function_tool_path: str | None) -> dict[str, Any]:
    """Name -> tool of both sources; the same name twice is an error. ToolConfigError.key names the source."""
    tools: list[Any] = []
    for key, path, load in (
        ("tool_config_path", tool_config_path, load_tool_config),
        ("function_tool_path", function_tool_path, load_function_tools),
    ):
        try:
            tools += load(path) if path else []
        except ToolConfigError as exc:
            raise ToolConfigError(str(exc), key) from None
    by_name: dict[str, Any] = {}
    for tool in tools:
        if tool.name in by_name:
            raise ToolConfigError(
                f"two tools are named {tool.name!r} (tool_config_path={tool_config_path}, "
                f"function_tool_path={function_tool_path})",
                "tool_config_path",
            )
        by_name[tool.name] = tool
    return by_name
