"""What a run prints for its user: Ray's start-up without the notices that ask nothing of the user, workers without
progress bars for sub-second work, and the run's last word (``last_word``): why it ended, what validation reached,
where its results are and how to go on; and the progress bar of the budget that ends the run (``BudgetBar``).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

VAL_SCORE = re.compile(r"val-core/.+/reward/mean@\d+")  # trainer.observing.metrics.validation_metrics' headline
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
    models a run loads) off, unless the user's environment asks for progress bars; and the modules imported before
    a user's file runs (``COLORL_PRELOAD``, workers/tools/registry.py), on a joined cluster too."""
    preload = {"COLORL_PRELOAD": os.environ["COLORL_PRELOAD"]} if "COLORL_PRELOAD" in os.environ else {}
    return {"HF_HUB_DISABLE_PROGRESS_BARS": os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "1"), **preload}


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
    trained: Sequence[str] = (),
) -> str:
    """The lines a run ends with: why it ended (``why``), steps, what each epoch trained (``trained``: the ledger's
    lines, ``trainer.state.ledger``), validation's first and best score, wall time, where the checkpoint, the report
    and the metrics are (``paths``: name -> path or None), and the commands to go on."""
    argv = list(sys.argv[1:] if argv is None else argv)
    of = f" of {total_steps}" if total_steps else ""
    lines = [f"colorl: run ended: {why}", f"  steps: {step}{of} done in {_duration(wall_s)}"]
    lines += [f"  {line}" for line in trained]
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


def continue_argv(argv: Sequence[str], done_step: int | None, resume_mode: str) -> list[str]:
    """The command-line arguments that continue a run started with ``argv``: the same ones under
    ``trainer.resume_mode=auto``; for a run that did all its steps (``done_step``), with twice as many."""
    extra = [f"trainer.total_training_steps={2 * done_step or 1}"] if done_step is not None else []
    if resume_mode != "auto":  # disable refuses a directory that holds a run; resume_path names an older one
        extra.append("trainer.resume_mode=auto")
    keys = tuple(e.split("=", 1)[0] + "=" for e in extra)
    return [a for a in argv if not a.lstrip("+").startswith(keys)] + extra


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {seconds:02d}s" if hours else f"{minutes}m {seconds:02d}s"


class BudgetBar:
    """A tqdm bar over the steps (``total_steps``) or the wall-time budget (``wall_budget_s``), whichever ends the
    run first at the pace of the steps so far; ``update(step)`` after each logged step."""

    def __init__(
        self,
        desc: str,
        total_steps: int,
        wall_budget_s: float | None,
        first_step: int = 0,
        started: float | None = None,
    ) -> None:
        self.total_steps, self.wall_budget_s, self.first_step = total_steps, wall_budget_s, first_step
        self.started = time.monotonic() if started is None else started  # the budget's clock (fit's start)
        self.step = first_step
        fraction, bar_format = self._shown()
        self.bar = tqdm(desc=desc, total=1.0, initial=fraction, bar_format=bar_format)

    def update(self, step: int) -> None:
        self.step = max(self.step, step)
        self._draw()

    def on_wall_clock(self) -> bool:
        """Whether the wall-time budget ends the run first: there is one, and the remaining steps at the pace so
        far (none yet: unknown) would not finish in it."""
        if self.wall_budget_s is None:
            return False
        done = self.step - self.first_step
        if done <= 0:
            return True
        per_step = (time.monotonic() - self.started) / done
        return per_step * (self.total_steps - self.first_step) > self.wall_budget_s

    def _draw(self) -> None:
        self.bar.n, self.bar.bar_format = self._shown()
        self.bar.refresh()

    def _shown(self) -> tuple[float, str]:
        """(the fraction of the budget that ends the run spent, tqdm's ``bar_format`` saying it)."""
        elapsed = time.monotonic() - self.started
        if self.on_wall_clock():
            fraction = min(elapsed / self.wall_budget_s, 1.0)
            text = f"{elapsed / 60:.1f}/{self.wall_budget_s / 60:.1f} min (trainer.max_wall_time_s), step {self.step}"
        else:
            done = self.step - self.first_step
            left = _clock(elapsed / done * (self.total_steps - self.step)) if done > 0 else "?"
            fraction = self.step / self.total_steps if self.total_steps else 1.0
            text = f"{self.step}/{self.total_steps} steps [{_clock(elapsed)}<{left}]"
        return fraction, "{desc}: {percentage:3.0f}%|{bar}| " + text

    def write(self, line: str) -> None:
        self.bar.write(line)

    def close(self) -> None:
        self.bar.close()


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"
