"""verl's ``verl.tools.function_tool``: ``@function_tool`` makes a typed, documented function a tool (ColoRL's, in
workers/tools/registry.py)."""

from workers.tools.registry import function_tool

__all__ = ["function_tool"]
