"""What a run prints for its user: Ray's start-up without the notices that ask nothing of the user, workers without
progress bars for sub-second work, and the run's last word (``last_word``): why it ended, what validation reached,
where its results are and how to go on.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

VAL_SCORE = re.compile(r"val-core/.+/reward/mean@\d+")  # trainer.metrics.validation_metrics' headline
# Ray's own switch for its Python loggers: when the user sets it, Ray's notices print as Ray decides
RAY_LOGGING_VARIABLES = ("RAY_LOGGER_LEVEL", "RAY_LOGGING_CONFIG_ENCODING")


def quiet_ray_init_kwargs() -> dict[str, Any]:
    """``ray.init`` arguments (and logger levels) that keep Ray's start-up notices off the console (the token-auth
    warning, "Started a local Ray instance"); none when the user set one of Ray's logging variables."""
    if any(name in os.environ for name in RAY_LOGGING_VARIABLES):
        return {}
    logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
    return {"logging_level": logging.WARNING}


def worker_env() -> dict[str, str]:
    """The workers' environment for a quiet console: transformers' "Loading weights" bar (under a second for the
    models a run loads) off, unless the user's environment asks for progress bars."""
    return {"HF_HUB_DISABLE_PROGRESS_BARS": os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "1")}


def validation_scores(records: Sequence[dict[str, Any]]) -> tuple[str, tuple[int, float], tuple[int, float]] | None:
    """(metric, (step, first score), (step, best score)) of the first validation headline in ``records``."""
    for record in records:
        key = next((k for k in record if VAL_SCORE.fullmatch(k)), None)
        if key is not None:
            scored = [(r["step"], r[key]) for r in records if key in r]
            return key, scored[0], max(scored, key=lambda s: s[1])
    return None


def last_word(
    why: str,
    step: int,
    total_steps: int | None,
    wall_s: float,
    records: Sequence[dict[str, Any]],
    paths: dict[str, Path | None],
    local_dir: str,
    argv: Sequence[str] | None = None,
) -> str:
    """The lines a run ends with: why it ended (``why``), steps, validation's first and best score, wall time, where
    the checkpoint, the report and the metrics are (``paths``: name -> path or None), and the commands to go on."""
    argv = list(sys.argv[1:] if argv is None else argv)
    of = f" of {total_steps}" if total_steps else ""
    lines = [f"colorl: run ended: {why}", f"  steps: {step}{of} done in {_duration(wall_s)}"]
    scores = validation_scores(records)
    if scores is not None:
        key, (first_step, first), (best_step, best) = scores
        lines.append(f"  {key}: {first:.4g} at step {first_step}, best {best:.4g} at step {best_step}")
    lines += [f"  {name}: {path.resolve() if path else 'none'}" for name, path in paths.items()]
    command = shlex.join(["python", "main.py", *argv])
    if paths.get("checkpoint"):
        lines.append(f"  continue (resumes from the last checkpoint): {command}")
        lines.append(f"  export to Hugging Face: python -m trainer.export {shlex.quote(local_dir)} --out <dir>")
    else:
        lines.append("  no checkpoint to continue or export from: set trainer.save_freq > 0")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {seconds:02d}s" if hours else f"{minutes}m {seconds:02d}s"
