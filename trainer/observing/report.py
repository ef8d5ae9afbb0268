"""The run report: ``<trainer.default_local_dir>/report.html``, one self-contained file (data, script and style
inlined; no network), written at each validation and at the end of a run.

It shows what each epoch trained (the run's ledger, ``trainer.state.ledger``: trained N of M prompts, filtered,
dropped), the metrics as an interactive plot grid (the panels of ``reward_curve.png``,
``trainer.observing.tracking.PANELS``, plus any logged metric; hover for values, drag to zoom on steps) with the steps
where each health warning held, the health warnings in words, a trajectory browser over the sampled responses of each
step and validation (``trainer.observing.generations``: prompt, response, reward, advantage, every turn of a tool
conversation, the tokens coloured by whether training saw them and by advantage or log-prob), and the config with its
differences from the preset it is closest to. The page's script and style are ``report_assets/`` beside this file.

The file stays small: metrics are stored by column with 4 significant digits, each prompt once, and when the
samples exceed ``SAMPLE_BUDGET`` bytes only every k-th step keeps its samples (the latest always does).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from config.tree import flat
from trainer.observing.generations import SAMPLES_DIR, read_jsonl
from trainer.observing.tracking import PANELS, series_label

ASSETS = Path(__file__).resolve().parent / "report_assets"
REPORT_FILE = "report.html"
SAMPLES_SLOT = "\0samples"  # where the samples' JSON goes into the data's
SAMPLE_BUDGET = 3_500_000  # bytes of samples and their prompts in one report (the rest: well under 1 MB)
KEEP_PER_SAMPLE = (
    "output",
    "gts",
    "reward",
    "score",
    "data_source",
    "uid",
    "response_length",
    "clipped",
    "messages",
    "num_turns",
    "tool_call_counts",
    "tool_error_counts",
    "stop_reason",
    "tokens",
    "trained",
    "advantages",
    "log_probs",
)


class RunReport:
    """The report of a run with ``config`` (a ``PPOConfig``; nothing is written when ``trainer.report.enable`` is
    false), in its ``trainer.default_local_dir``. The config's differences from its closest preset are found once
    (``compare_presets``); each sample file read is kept as JSON ready to inline, so that a later ``write`` reads
    only the steps written since (a file rewritten by a resumed run is read again). ``ledger`` gives the lines of
    what each epoch trained (``trainer.state.ledger.Ledger.summary``) at each write."""

    def __init__(
        self, config: Any, compare_presets: bool = True, ledger: Callable[[], list[str]] | None = None
    ) -> None:
        self.config, self.enabled = config, config.trainer.report.enable
        self.ledger = ledger
        self.local_dir = Path(config.trainer.default_local_dir)
        self.config_diff = preset_diff(config) if self.enabled and compare_presets else None
        self.files: dict[Path, tuple[tuple[int, int], str, dict[str, str]]] = {}  # path -> (stat, JSON, prompts)

    def write(self, records: list[dict[str, Any]], warnings: dict[str, tuple[int, str]] | None = None) -> Path | None:
        """The report of the logged ``records`` (``metrics.jsonl``'s), the samples under ``<local_dir>/samples/`` and
        the health ``warnings`` that fired (name -> (step, message)), written atomically; its path, or None when
        disabled or the disk refused it (a warning says so: the run goes on)."""
        if not self.enabled:
            return None
        path = self.local_dir / REPORT_FILE
        staging = path.with_suffix(".html.tmp")
        try:
            staging.write_text(self._page(records, warnings or {}), encoding="utf-8")
            staging.replace(path)
            return path
        except OSError as exc:  # a full disk: the previous report stays, the run goes on
            with contextlib.suppress(OSError):
                staging.unlink(missing_ok=True)
            print(f"colorl: warning: cannot write the run report ({exc})", file=sys.stderr)
            return None

    def _page(self, records: list[dict[str, Any]], warnings: dict[str, tuple[int, str]]) -> str:
        config, config_diff = self.config, self.config_diff
        panels = [
            {"title": p.title, "left": _panel_keys(p.left, records), "right": _panel_keys(p.right, records)}
            | {"warning": p.warning}
            for p in PANELS
        ]
        samples, prompts = self._samples()
        data = {
            "title": f"{config.trainer.project_name} / {config.trainer.experiment_name}",
            "written": time.strftime("%Y-%m-%d %H:%M:%S"),
            "metrics": _metric_columns(records),
            "panels": panels,
            "labels": {k: series_label(k) for panel in panels for k in panel["left"] + panel["right"]},
            "warnings": [{"name": k, "step": step, "message": text} for k, (step, text) in warnings.items()],
            "ledger": self.ledger() if self.ledger is not None else [],
            "config": dict(flat(config)),
            "preset": config_diff[0] if config_diff else None,
            "diff": [[k, _jsonable(a), _jsonable(b)] for k, a, b in config_diff[1]] if config_diff else [],
            "prompts": prompts,
            "samples": SAMPLES_SLOT,
        }
        return _render(data, samples)

    def _samples(self) -> tuple[str, dict[str, str]]:
        """The samples as inlined JSON, ``{"train": {step: [...]}, "val": {...}}``, and the prompts they name
        (id -> text); when they exceed ``SAMPLE_BUDGET`` only every k-th step keeps its samples (and the latest)."""
        steps: dict[str, dict[int, tuple[str, dict[str, str]]]] = {}
        for kind in ("train", "val"):
            directory = self.local_dir / SAMPLES_DIR / kind
            paths = {int(p.stem): p for p in directory.glob("*.jsonl") if p.stem.isdigit()}
            steps[kind] = {step: self._read(path) for step, path in sorted(paths.items())}
        total = sum(  # a prompt shared by several steps counts for each: an upper bound
            len(text) + sum(map(len, prompts.values()))
            for by_step in steps.values()
            for text, prompts in by_step.values()
        )
        every = math.ceil(total / SAMPLE_BUDGET) if total > SAMPLE_BUDGET else 1
        prompts: dict[str, str] = {}
        parts = []
        for kind, by_step in steps.items():
            ordered = list(by_step)
            kept = set(ordered[::every]) | set(ordered[-1:])
            parts.append(f'"{kind}":{{' + ",".join(f'"{s}":{by_step[s][0]}' for s in ordered if s in kept) + "}")
            for step in kept:
                prompts.update(by_step[step][1])
        return "{" + ",".join(parts) + "}", prompts

    def _read(self, path: Path) -> tuple[str, dict[str, str]]:
        stat = path.stat()
        key = (stat.st_mtime_ns, stat.st_size)
        cached = self.files.get(path)
        if cached is None or cached[0] != key:
            prompts: dict[str, str] = {}
            rows = [_sample(record, prompts) for record in read_jsonl(path)]
            cached = self.files[path] = (key, _json(rows), prompts)
        return cached[1], cached[2]


def write_report(records: list[dict[str, Any]], config: Any, warnings: dict | None = None) -> Path | None:
    """A report written once (``RunReport``), without the presets' comparison."""
    return RunReport(config, compare_presets=False).write(records, warnings)


def _json(value: Any) -> str:
    # "<" only occurs inside JSON strings: as \u003c no sample text can end or comment out the data block
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).replace("<", "\\u003c")


def _render(data: dict[str, Any], samples: str) -> str:
    """The page: ``report_assets/report.html`` with the style, the script and the data inlined."""
    head, _, tail = _json(data).rpartition(json.dumps(SAMPLES_SLOT))  # the last key's value
    payload = head + samples + tail
    page = (ASSETS / "report.html").read_text(encoding="utf-8")
    script = "\n".join((ASSETS / name).read_text(encoding="utf-8") for name in ("plots.js", "browser.js", "main.js"))
    style = (ASSETS / "report.css").read_text(encoding="utf-8")
    # the data last: a sample's text may hold the other placeholders
    return page.replace("/*SCRIPT*/", script, 1).replace("/*STYLE*/", style, 1).replace("/*DATA*/", payload, 1)


def _metric_columns(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Every numeric metric as a column over the logged steps (null where a step lacks it); a step logged twice
    keeps its latest values."""
    by_step: dict[int, dict[str, float]] = {}
    for record in records:
        values = by_step.setdefault(int(record.get("step", 0)), {})
        values.update({k: v for k, v in record.items() if k != "step" and _is_number(v)})
    steps = sorted(by_step)
    keys = sorted({k for values in by_step.values() for k in values})
    return {
        "steps": steps,
        "series": {k: [_short(by_step[s].get(k)) for s in steps] for k in keys},
    }


def _panel_keys(patterns: tuple, records: list[dict[str, Any]]) -> list[str]:
    keys = sorted({k for r in records for k in r})
    return [k for p in patterns for k in keys if (k == p if isinstance(p, str) else p.fullmatch(k))]


def _sample(record: dict[str, Any], prompts: dict[str, str]) -> dict[str, Any]:
    """What the browser shows of a dumped record; its prompt goes to ``prompts`` under a short hash of its text."""
    sample = {k: record[k] for k in KEEP_PER_SAMPLE if k in record and record[k] is not None}
    text = str(record.get("input", ""))
    sample["prompt"] = hashlib.sha1(text.encode()).hexdigest()[:12]
    prompts[sample["prompt"]] = text
    return sample


def preset_diff(config: Any) -> tuple[str, list[tuple[str, Any, Any]]] | None:
    """(the preset in ``conf/`` closest to ``config``, [(key, the preset's value, this run's value)] where they
    differ); None when no preset composes. Each preset is composed from its YAML, without the command line, and
    loaded as a run's config is (``config.load.to_config``: the installed adapter fills in the derived keys)."""
    from hydra import compose, initialize_config_dir

    from config.load import CONF_DIR, to_config

    run = dict(flat(config))
    best: tuple[str, list] | None = None
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for path in sorted(CONF_DIR.glob("*.yaml")):
            try:
                preset = dict(flat(to_config(compose(config_name=path.stem), announce=False)))
            except Exception:  # noqa: BLE001 - a preset that needs an environment this run lacks is no candidate
                continue
            diff = [(k, preset.get(k), v) for k, v in run.items() if not _same(preset.get(k), v)]
            if best is None or len(diff) < len(best[1]):
                best = (path.stem, diff)
    return best


def _same(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b) or (isinstance(a, str) and _is_number(b)):
        try:
            return float(a) == float(b)
        except ValueError:
            return False
    return a == b or (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and list(a) == list(b))


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, list, dict, type(None))) else str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _short(value: float | None) -> float | None:
    """4 significant digits (None for a missing or non-finite value): enough to plot and to read on hover."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.4g}")
