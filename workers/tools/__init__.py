"""Tools for multi-turn rollouts (``rollout.multi_turn``): the interface, the built-ins, loading and running them.

Built-in: ``workers.tools.calculator.CalculatorTool`` (safe arithmetic) and ``workers.tools.answer.AnswerTool``
(verl's ``calc_gsm8k_reward``). A user's tool subclasses ``BaseTool``; a stateless one can be a function marked
with ``function_tool``. See docs/tools.md.
"""

from workers.tools.base import BaseTool, ToolConfigError, ToolResponse, ToolSchema
from workers.tools.registry import function_tool, load_tools
from workers.tools.session import ToolBox, ToolSession

__all__ = [
    "BaseTool",
    "ToolBox",
    "ToolConfigError",
    "ToolResponse",
    "ToolSchema",
    "ToolSession",
    "function_tool",
    "load_tools",
]
