"""Experiment tracking: one ``log(metrics, step)`` call fans out to the configured backends.

Backends (``trainer.logger``):
- ``console``: a progress bar over the training steps, or the wall-time budget when that ends the run first
  (``trainer.running.console.BudgetBar``), plus one compact line per step;
- ``wandb``: a W&B run under ``<local_dir>/wandb``, offline unless ``WANDB_MODE`` says otherwise;
- ``file``: ``<local_dir>/metrics.jsonl``, one JSON object per step with a ``step`` key. A resumed run continues
  the same file, which then holds one history: the steps logged after the checkpoint it continues from (by an
  attempt that crashed or was killed; all of them when it left no checkpoint) are removed first, since they are
  computed again, and so is a partial last line (a full disk, a crash mid-write).
``log_generations`` shows validation samples (``trainer.log_val_generations``): printed on the console, and in wandb
as the ``val/generations`` table (a row per validation: the step, then each sample's input, output and score).
``finish()`` also draws ``<local_dir>/reward_curve.png``: a grid of the run's health against step (reward and
validation, response length, entropy and KL, prompt groups with all-equal rewards). matplotlib draws it; where it
is not installed, one line says the plot is skipped, and the run is otherwise the same.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from config.checks import ConfigError
from config.schema import LoggerBackend
from trainer.running.console import BudgetBar
from workers.checkpoint.safe_files import write_atomically

LOGGER_BACKENDS = get_args(LoggerBackend)

TRAIN_SCORE = "critic/score/mean"
GENERATION_COLUMNS = ("input", "output", "score")  # each sample's columns in wandb's val/generations
VAL_REWARD = re.compile(r"val-core/(.+)/reward/mean@1")  # group 1: the data source
# (metric, label) pairs shown on the console line when present
CONSOLE_METRICS = (
    (TRAIN_SCORE, "score"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/entropy", "entropy"),
    ("actor/kl_loss", "kl_loss"),
    ("critic/vf_loss", "vf_loss"),
    ("response_length/mean", "resp_len"),
)


class Tracking:
    """Fan-out logger; ``wandb_run_id`` is kept so that a resumed run can append to the same W&B run."""

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        backends: list[str],
        config: dict[str, Any],
        local_dir: str,
        total_steps: int | None = None,
        wall_budget_s: float | None = None,
        started: float | None = None,
        resume_id: str | None = None,
        resume_step: int = 0,
    ) -> None:
        unknown = [b for b in backends if b not in LOGGER_BACKENDS]
        if unknown:
            raise ConfigError(f"trainer.logger: unknown backend(s) {unknown}; valid: {', '.join(LOGGER_BACKENDS)}")
        self.local_dir = Path(local_dir)
        self.local_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.local_dir / "metrics.jsonl"
        self.plot_path = self.local_dir / "reward_curve.png"
        self._history: list[dict[str, Any]] = []  # this run's numbers, for the plot and report when there is no file
        console = "console" in backends  # the bar counts what ends the run: its steps or its wall-time budget
        self._bar = (
            BudgetBar(experiment_name, total_steps or 0, wall_budget_s, resume_step, started) if console else None
        )
        self._to_file = "file" in backends
        self._file = self._open_history(resume_step) if self._to_file else None
        self._wandb_run = None
        self.wandb_run_id: str | None = None
        if "wandb" in backends:
            self._wandb_run = self._init_wandb(project_name, experiment_name, config, resume_id)
            self.wandb_run_id = self._wandb_run.id
        self._generations_table: list[list[Any]] = []  # the wandb table's rows so far
        self._finished = False

    def _open_history(self, resume_step: int) -> Any:
        """metrics.jsonl opened for appending, holding only the steps up to ``resume_step`` (see the module's doc)."""
        if self.metrics_path.exists():
            records, partial = _read_records(self.metrics_path)
            kept = [r for r in records if r.get("step", 0) <= resume_step] if resume_step else []  # 0: a fresh start
            dropped = sorted({r.get("step", 0) for r in records} - {r.get("step", 0) for r in kept})
            if dropped:
                when = f"after the checkpoint of step {resume_step}" if resume_step else "that left no checkpoint"
                print(
                    f"colorl: metrics.jsonl: removing steps {dropped[0]}-{dropped[-1]}, logged by an earlier attempt "
                    f"{when}: this run computes them again",
                    file=sys.stderr,
                )
            if partial:
                print(
                    "colorl: metrics.jsonl: removing a partial line (a full disk or a crash while writing)",
                    file=sys.stderr,
                )
            if dropped or partial:
                write_atomically(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept))
        return open(self.metrics_path, "a", encoding="utf-8")

    def _init_wandb(self, project: str, name: str, config: dict[str, Any], resume_id: str | None) -> Any:
        import wandb  # imported only when asked for: it is slow to import and starts a service process

        return wandb.init(
            project=project,
            name=name,
            config=config,
            dir=str(self.local_dir),  # wandb adds its own "wandb/" below this
            mode=os.environ.get("WANDB_MODE", "offline"),  # runs must not need the network unless asked to
            id=resume_id,
            resume="allow" if resume_id else None,
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Record ``metrics`` (name -> number) for ``step`` in every backend."""
        values = {k: _plain(v) for k, v in metrics.items()}
        record = {"step": step, **values}
        self._history.append({k: v for k, v in record.items() if _is_number(v)})
        if self._file is not None:
            try:
                self._file.write(json.dumps(record) + "\n")
                self._file.flush()  # a crashed or killed run keeps every finished step
            except OSError as exc:  # a full disk: the run goes on (its checkpoint save will say more)
                print(
                    f"colorl: warning: cannot write {self.metrics_path} ({exc}); no more metrics go there",
                    file=sys.stderr,
                )
                self._close_file()
        if self._wandb_run is not None:
            self._wandb_run.log(values, step=step)
        if self._bar is not None:
            self._bar.update(step)
            self._bar.write(_console_line(record))

    def log_generations(self, samples: list[tuple[str, str, float]], step: int) -> None:
        """Validation samples (input, output, score) of ``step``: printed on the console, and with wandb the
        ``val/generations`` table logged again with this validation's row added."""
        if self._bar is not None:
            for i, (prompt, output, score) in enumerate(samples, start=1):
                self._bar.write(f"[val sample {i}/{len(samples)} step {step} score {score:.4g}]\n{prompt}\n→ {output}")
        if self._wandb_run is not None:
            import wandb

            columns = ["step"] + [f"{name}_{i}" for i in range(1, len(samples) + 1) for name in GENERATION_COLUMNS]
            self._generations_table.append([step, *(value for sample in samples for value in sample)])
            self._wandb_run.log(
                {"val/generations": wandb.Table(columns=columns, data=self._generations_table)}, step=step
            )

    def finish(self) -> None:
        """Close every backend and write the reward plot; calling it twice is harmless."""
        if self._finished:
            return
        self._finished = True
        self._close_file()
        if self._bar is not None:
            self._bar.close()
        if self._wandb_run is not None:
            self._wandb_run.finish()
        try:
            plot_reward_curve(self.records(), self.plot_path)
        except OSError as exc:  # a full disk must not hide how the run ended
            print(f"colorl: warning: cannot write {self.plot_path} ({exc})", file=sys.stderr)
        except ImportError as exc:  # matplotlib (or a module it needs) is not installed
            missing = exc.name or "matplotlib"
            print(
                f"colorl: {self.plot_path.name} skipped: {missing} is not installed (pip install matplotlib draws it)",
                file=sys.stderr,
            )

    def records(self) -> list[dict[str, Any]]:
        """Every step logged so far; with the file backend those of earlier (resumed) attempts too, so that the
        plots show the whole run."""
        if self._to_file and self.metrics_path.exists():
            return read_metrics(self.metrics_path)
        return self._history

    def _close_file(self) -> None:
        try:
            if self._file is not None:
                self._file.close()
        except OSError:  # the last flush failed (a full disk): its partial line is removed on the next open
            pass
        self._file = None


def _plain(value: Any) -> Any:
    """Numbers as Python scalars (tensors and numpy scalars via ``.item()``) so json and wandb accept them."""
    return value.item() if hasattr(value, "item") else value


def _console_line(record: dict[str, Any]) -> str:
    parts = [f"step {record['step']}"]
    parts += [f"{label} {record[key]:.4g}" for key, label in CONSOLE_METRICS if _is_number(record.get(key))]
    parts += [
        f"val[{match[1]}] {value:.4g}"
        for key, value in record.items()
        if (match := VAL_REWARD.fullmatch(key)) and _is_number(value)
    ]
    if _is_number(record.get("timing_s/step")):
        parts.append(f"{record['timing_s/step']:.2f}s/step")
    return " | ".join(parts)


def _is_plotted(key: str) -> bool:
    return any(panel.plots(key) for panel in PANELS)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, in the order they were logged (a partial line is skipped)."""
    return _read_records(path)[0]


def _read_records(path: str | os.PathLike) -> tuple[list[dict[str, Any]], bool]:
    """(the records, whether a line was unreadable: a write cut short by a full disk or a crash)."""
    records, partial = [], False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in filter(str.strip, f):
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                records.append(record)
            else:
                partial = True
    return records, partial


@dataclass(frozen=True)
class Panel:
    """One plot of the end-of-run grid: its series on the left axis, those of another scale on the right one, and
    the health warning whose first step it marks."""

    title: str
    left: tuple[str | re.Pattern, ...]
    right: tuple[str | re.Pattern, ...] = ()
    warning: str | None = None

    def plots(self, key: str) -> bool:
        return any(_matches(p, key) for p in (*self.left, *self.right)) or key == f"health/warning/{self.warning}"


HELD_OUT_EXTRA = re.compile(r"val-aux/(.+)/(.+)/mean@1")  # scores the reward does not train, e.g. the flexible one
PANELS = (
    Panel("reward and validation", (TRAIN_SCORE, VAL_REWARD, HELD_OUT_EXTRA), warning="reward_vs_held_out"),
    Panel("response length", ("response_length/mean",), ("response_length/clip_ratio",), "responses_at_limit"),
    Panel("entropy and KL", ("actor/entropy",), ("actor/kl_loss", "actor/ref_kl"), "entropy_collapse"),
    Panel("prompt groups with all-equal rewards", ("health/frac_reward_zero_std",), warning="all_equal_groups"),
)


def plot_reward_curve(records: list[dict[str, Any]], path: str | os.PathLike) -> bool:
    """A 2 × 2 grid (``PANELS``) against step: training score and validation rewards, response length (and the
    share cut at the limit), entropy and KL, and the share of prompt groups with all-equal rewards; a dotted line
    where a health warning first fired. False (no file) when none of it was logged.

    A step logged twice (a run resumed from an earlier checkpoint) keeps its latest value.
    """
    curves: dict[str, dict[int, float]] = {}
    for record in records:
        for key, value in record.items():
            if _is_plotted(key) and _is_number(value) and math.isfinite(value):
                curves.setdefault(key, {})[record["step"]] = value
    if not any(not k.startswith("health/warning/") for k in curves):
        return False
    from matplotlib.figure import Figure  # here: a run without matplotlib skips the plot (``Tracking.finish``)

    fig = Figure(figsize=(11, 7), layout="tight")  # a bare Figure renders with Agg; pyplot's global state not needed
    for ax, panel in zip(fig.subplots(2, 2).flat, PANELS):
        _draw_panel(ax, panel, curves)
    fig.savefig(path, dpi=100, metadata={"Title": " | ".join(panel.title for panel in PANELS)})
    return True


def _draw_panel(ax: Any, panel: Panel, curves: dict[str, dict[int, float]]) -> None:
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    drawn = _draw_series(ax, panel.left, curves, 0)
    if any(_matches(p, k) for p in panel.right for k in curves):  # another scale: the right axis
        twin = ax.twinx()
        drawn += _draw_series(twin, panel.right, curves, drawn, linestyle="--")
        twin.legend(loc="upper right", fontsize=7)
    fired = [step for step, flag in sorted(curves.get(f"health/warning/{panel.warning}", {}).items()) if flag]
    if fired:
        ax.axvline(fired[0], color="red", linestyle=":", label=f"warning: {panel.warning}")
    if drawn or fired:
        ax.legend(loc="upper left", fontsize=7)
    else:
        ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center", color="gray")


def _matches(pattern: str | re.Pattern, key: str) -> bool:
    return key == pattern if isinstance(pattern, str) else pattern.fullmatch(key) is not None


def _draw_series(
    ax: Any,
    patterns: tuple[str | re.Pattern, ...],
    curves: dict[str, dict[int, float]],
    color_offset: int,
    linestyle: str = "-",
) -> int:
    keys = [k for p in patterns for k in sorted(curves) if _matches(p, k)]
    for i, key in enumerate(keys):
        points = curves[key]
        steps = sorted(points)
        ax.plot(
            steps,
            [points[s] for s in steps],
            marker="o" if len(steps) < 30 else None,
            markersize=3,
            linestyle=linestyle,
            color=f"C{color_offset + i}",
            label=series_label(key),
        )
    return len(keys)


def series_label(key: str) -> str:
    """A metric's name in a legend."""
    if key == TRAIN_SCORE:
        return "train score"
    if match := VAL_REWARD.fullmatch(key):
        return f"val reward@1 ({match[1]})"
    if match := HELD_OUT_EXTRA.fullmatch(key):
        return f"val {match[2]} ({match[1]})"
    return key
