"""verl's ``verl.tools.schemas``: OpenAI's function-tool schema and a tool's response (ColoRL's classes in
workers/tools/base.py, which answer to the part of pydantic's surface tool code uses)."""

from workers.tools.base import FunctionSchema as OpenAIFunctionSchema
from workers.tools.base import ParametersSchema as OpenAIFunctionParametersSchema
from workers.tools.base import PropertySchema as OpenAIFunctionPropertySchema
from workers.tools.base import ToolResponse
from workers.tools.base import ToolSchema as OpenAIFunctionToolSchema

__all__ = [
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionPropertySchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolSchema",
    "ToolResponse",
]
