"""Loading the tools a run names: a tool YAML (``multi_turn.tool_config_path``) and function tools
(``multi_turn.function_tool_path``).

The YAML lists one entry per tool::

    tools:
      - class_name: workers.tools.calculator.CalculatorTool   # or path/to/my_tools.py:MyTool
        config: {type: native}                               # passed to the class; type must be native
        tool_schema: {type: function, function: {name, description, parameters}}   # optional

``class_name`` is an importable dotted path or a Python file and a class (``file.py:Class``). The class subclasses
``workers.tools.BaseTool``, or the base class of a tool family a door package installs (``ToolFamily``,
``install_family``): a family adds its base class, the schema object its classes take, names of its former
built-in classes and its own function-tool registry. The modules ``COLORL_PRELOAD`` names are imported before a
user's file runs, so a door named there serves the import paths the file uses and installs its family. Without
``tool_schema`` the class's own schema is used (``default_schema`` or what ``get_openai_tool_schema()`` returns).
A function-tool file holds functions marked with ``@function_tool`` (or a family's decorator); their schema comes
from their signature and docstring (``transformers.utils.get_json_schema``). Naming a class or a file **runs that
code** in the driver (to check it) and in every rollout worker, as ``reward.custom_reward_function`` does.
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

_MARK = "__colorl_function_tool__"
# Modules imported before a user's file runs (comma-separated): they may make names importable that the user's file
# imports and install a tool family (main.py names its door; Ray workers inherit the variable)
PRELOAD = "COLORL_PRELOAD"


class ToolFamily:
    """Another library's tool classes, taken beside ColoRL's: a door package subclasses this and installs it
    (``install_family``) when imported. The base answers for no family: no classes, no aliases, no functions."""

    # class_name a config may give -> the class ColoRL serves for it (a family's former built-ins)
    aliases: dict[str, str] = {}
    base_name = ""  # the dotted name of the family's base class, for the error that names the accepted ones

    def base(self) -> type | None:
        """The family's tool base class, or None while its code is not loaded."""
        return None

    def schema(self, schema: dict) -> Any:
        """``schema`` as the schema object the family's classes take (raise on an invalid one)."""
        raise NotImplementedError

    def function_tools(self, module: Any) -> list[tuple[Callable, str, Any]]:
        """(function, name, schema) of each function of ``module`` the family's own decorator registered."""
        return []


_families: list[ToolFamily] = []


def install_family(family: ToolFamily) -> None:
    """Make the loader take ``family``'s tools (once per family class: importing a door twice adds nothing)."""
    if not any(type(known) is type(family) for known in _families):
        _families.append(family)


def _preload() -> None:
    for name in filter(None, os.environ.get(PRELOAD, "").split(",")):
        importlib.import_module(name.strip())


def _family_of(cls: type) -> ToolFamily | None:
    return next((f for f in _families if (base := f.base()) is not None and issubclass(cls, base)), None)


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
    _preload()
    for family in _families:
        spec = family.aliases.get(spec, spec)
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


def _schema_for(cls: type, schema: dict | None, where: str) -> Any:
    """The schema object ``cls`` takes: ColoRL's ``ToolSchema``, or its family's for a family's class."""
    if schema is None:
        return None
    family = _family_of(cls)
    if family is not None:
        try:
            return family.schema(schema)
        except Exception as exc:  # the family's validation error, first line
            raise ToolConfigError(f"{where}.tool_schema: {str(exc).splitlines()[0]} ({schema!r})") from None
    return ToolSchema.from_dict(schema, f"{where}.tool_schema")


def _is_tool(tool: Any) -> bool:
    kinds = (BaseTool, *filter(None, (family.base() for family in _families)))
    return isinstance(tool, kinds) and isinstance(getattr(tool, "name", None), str)


def _base_names() -> str:
    names = [family.base_name for family in _families if family.base_name]
    return f" (or of {', '.join(names)})" if names else ""


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
    except Exception as exc:  # the user's constructor (or a family's base class finding no schema)
        raise ToolConfigError(
            f"{where}: {entry['class_name']}(config, tool_schema) raised {type(exc).__name__}: {exc}"
        ) from None
    if not _is_tool(tool):
        raise ToolConfigError(
            f"{where}: {entry['class_name']} is not a subclass of workers.tools.BaseTool{_base_names()}"
        )
    return tool


def load_tool_config(path: str) -> list[Any]:
    """The tools of a tool YAML."""
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
    """Mark a function as a tool: ``@function_tool``, ``@function_tool("name")`` or
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
    """How a function tool's return value is read: a ``ToolResponse`` or a str as it is, a dict as its JSON,
    a tuple as (response, reward[, metrics]) with the response read the same way, anything else as its str."""
    if isinstance(value, tuple):
        return (function_result(value[0]), *value[1:]) if value else value
    if isinstance(value, dict):
        return ToolResponse(text=json.dumps(value, ensure_ascii=False))
    return value if isinstance(value, (str, ToolResponse)) or hasattr(value, "text") else ToolResponse(text=str(value))


def load_function_tools(path: str) -> list[BaseTool]:
    """A ``FunctionTool`` for every ``@function_tool`` function in the Python file ``path``."""
    module = _import_file(path)
    marked = [value for value in vars(module).values() if callable(value) and hasattr(value, _MARK)]
    tools = [FunctionTool(fn, *getattr(fn, _MARK)) for fn in marked]
    tools += [FunctionTool(*entry) for family in _families for entry in family.function_tools(module)]
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
