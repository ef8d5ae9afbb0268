"""verl's ``verl.utils.rollout_trace``: ``@rollout_trace_op`` (ColoRL traces no tool calls: it returns the method
as it is)."""

from typing import Any

__all__ = ["rollout_trace_op"]


def rollout_trace_op(function: Any) -> Any:
    """verl's tracing decorator: ColoRL does not trace, so it changes nothing."""
    return function
