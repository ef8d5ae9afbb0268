"""verl's ``verl.utils.rollout_trace``: ``@rollout_trace_op`` (ColoRL traces no tool calls: it returns the method
as it is; workers/tools/base.py)."""

from workers.tools.base import rollout_trace_op

__all__ = ["rollout_trace_op"]
