"""verl's ``verl.tools.base_tool``: the base class of a tool (ColoRL's ``workers.tools.base.BaseTool``)."""

from verl_compat.utils.rollout_trace import rollout_trace_op
from workers.tools.base import BaseTool, ToolResponse
from workers.tools.base import ToolSchema as OpenAIFunctionToolSchema

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolResponse", "rollout_trace_op"]
