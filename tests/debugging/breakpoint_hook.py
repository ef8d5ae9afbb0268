"""A ``PYTHONBREAKPOINT`` hook for a replay's subprocess: instead of opening pdb, appends to the file that
``COLORL_BREAKPOINT_LOG`` names one JSON line of what the debugger would have had in hand (the caller's ``batch``
and ``trainer``)."""

import json
import os
import sys


def record(*args, **kwargs) -> None:
    here = sys._getframe(1).f_locals  # the frame that called breakpoint()
    batch, trainer, state = here.get("batch"), here.get("trainer"), here.get("state")
    seen = {"phase": here.get("phase"), "step": getattr(trainer, "global_step", None), "rows": None}
    seen["metrics"] = sorted(getattr(state, "metrics", {}))  # what the step's phases so far have measured
    if batch is not None:
        seen |= {
            "rows": len(batch),
            "tensors": sorted(batch.batch.keys()),
            "non_tensors": sorted(batch.non_tensor_batch),
            "score_mean": batch.batch["token_level_scores"].sum(-1).mean().item(),
        }
    with open(os.environ["COLORL_BREAKPOINT_LOG"], "a") as f:
        f.write(json.dumps(seen) + "\n")
