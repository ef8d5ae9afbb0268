"""Tools for multi-turn rollouts (``rollout.multi_turn``): the interface, the built-ins, loading and running them.

Built-in: ``workers.tools.calculator.CalculatorTool`` (safe arithmetic) and ``workers.tools.answer.AnswerTool``
(GSM8K's answer checker). A user's tool subclasses ``BaseTool`` (this one, or the base class of a tool family
a door package installs: ``registry.ToolFamily``; a file written for another trainer runs unchanged, see
docs/tools.md); a
stateless one can be a function marked with ``function_tool``. See docs/tools.md.
"""

from workers.tools.base import BaseTool, ToolConfigError, ToolResponse, ToolSchema
from workers.tools.registry import function_tool, load_tools
from workers.tools.session import AgentData, ToolBox

__all__ = [
    "AgentData",
    "BaseTool",
    "ToolBox",
    "ToolConfigError",
    "ToolResponse",
    "ToolSchema",
    "function_tool",
    "load_tools",
]
