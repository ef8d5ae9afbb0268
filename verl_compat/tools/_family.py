"""verl's tool classes as a tool family of ColoRL's loader (``workers.tools.registry.ToolFamily``).

- verl's former built-in ``verl.tools.gsm8k_tool.Gsm8kTool`` names ColoRL's answer tool, so verl's example tool
  configs load unchanged (verl 0.9 no longer ships it, with or without verl installed).
- A class may subclass verl's ``verl.tools.base_tool.BaseTool``: a file importing ``verl.*`` gets verl's classes
  where verl is installed and ColoRL's otherwise (the finder, ``verl_compat/_finder.py``); a class of the real verl
  gets verl's pydantic schema object (``verl.tools.schemas.OpenAIFunctionToolSchema``).
- Functions registered with the real verl's ``@function_tool`` (verl keeps a registry,
  ``verl.tools.function_tool.FUNCTION_TOOL_REGISTRY``) are function tools beside ColoRL's marked ones.

Importing ``verl_compat.tools`` installs it; ``main.py`` has the tool loader import that package first
(``COLORL_PRELOAD``), in the driver and in every rollout worker.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from workers.tools.registry import ToolFamily, install_family


def _installed_module(name: str) -> Any:
    """Module ``name`` if a user's file imported it from its own package; None if not imported, or if another
    package serves it under that name (its module keeps its own ``__name__``, e.g. the door's for ``verl.*``)."""
    module = sys.modules.get(name)
    return module if module is not None and module.__name__ == name else None


class VerlTools(ToolFamily):
    """The real verl's tool classes and function registry, and verl's former built-in tool names."""

    aliases = {"verl.tools.gsm8k_tool.Gsm8kTool": "workers.tools.answer.AnswerTool"}
    base_name = "verl.tools.base_tool.BaseTool"

    def base(self) -> type | None:
        """The real verl's ``BaseTool`` once a user's file imported it (the door's is ColoRL's own class)."""
        module = _installed_module("verl.tools.base_tool")
        return module.BaseTool if module is not None else None

    def schema(self, schema: dict) -> Any:
        """verl's pydantic schema (a pydantic validation error for an invalid one)."""
        return sys.modules["verl.tools.schemas"].OpenAIFunctionToolSchema.model_validate(schema)

    def function_tools(self, module: Any) -> list[tuple[Callable, str, Any]]:
        """The functions of ``module`` registered with the real verl's ``@function_tool``."""
        functions = _installed_module("verl.tools.function_tool")
        registry = getattr(functions, "FUNCTION_TOOL_REGISTRY", {}) if functions else {}
        return [
            (entry.fn, entry.name, entry.tool_schema)
            for entry in registry.values()
            if getattr(entry.fn, "__module__", None) == module.__name__
        ]


def install() -> None:
    """Make ColoRL's tool loader take verl's tool classes (idempotent)."""
    install_family(VerlTools())
