"""DAPO against plain GRPO on the SmolLM2 arithmetic preset: the same seed and wall-clock budget, one after the other.

    python -m data.preprocess.arith --out_dir DATA                        # the task (once)
    python -m benchmarks.dapo_race --model-path DIR --data-dir DATA --seed 1 [--minutes 15]
                                   [--plain smollm2_arith] [--dapo smollm2_dapo] [--set KEY=VALUE ...]

Each preset runs from its own launch (``benchmarks.learning_race.colorl_overrides``: model, data, seed, budget,
``--set`` overrides on both, ``--dapo-set`` on the DAPO run only). From each run's metrics.jsonl it reports:

- the strict accuracy curve (minute since launch, step, accuracy): the preset's greedy validation,
  ``val-core/<source>/reward/mean@1`` less the overlong penalty where the dapo reward manager logs it
  (``val-aux/<source>/overlong_reward/mean@1``), and the accuracy gained per minute to the last validation;
- the share of trained prompt groups with signal (responses whose rewards differ), per step and its mean;
- generation batches per step (``train/num_gen_batches``, 1 without dynamic sampling);
- seconds per trained prompt (``timing_s/step`` / ``data.train_batch_size``) and the training steps taken.

Prints JSON (``benchmarks.common.emit``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import emit, machine
from benchmarks.learning_race import colorl_overrides, first_gain

REPO = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", required=True, help="SmolLM2-135M-Instruct (python -m data.models.smollm2)")
    parser.add_argument("--data-dir", required=True, help="train.parquet and test.parquet (data.preprocess.arith)")
    parser.add_argument("--seed", type=int, default=1, help="trainer.seed and data.seed of both runs")
    parser.add_argument("--minutes", type=float, default=15.0, help="wall-clock budget of each run")
    parser.add_argument("--gain", type=float, default=0.30, help="the held-out accuracy gain to time")
    parser.add_argument("--plain", default="smollm2_arith", help="the plain preset")
    parser.add_argument("--dapo", default="smollm2_dapo", help="the DAPO preset")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="both runs")
    parser.add_argument("--dapo-set", dest="dapo_overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    return parser.parse_args(argv)


def run_preset(config_name: str, overrides: list[str]) -> list[dict]:
    """``main.py --config-name`` with ``overrides``; its metrics.jsonl rows, each with the minute since launch at
    which it was read (``_minute``)."""
    out_dir = next(o.partition("=")[2] for o in overrides if o.startswith("trainer.default_local_dir="))
    command = [sys.executable, "main.py", f"--config-name={config_name}", *overrides]
    launch = time.time()
    metrics, rows, seen = Path(out_dir) / "metrics.jsonl", [], 0
    process = subprocess.Popen(command, cwd=REPO, stdout=sys.stderr, stderr=sys.stderr)
    while True:
        running = process.poll() is None
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        for row in map(json.loads, lines[seen:]):
            rows.append({**row, "_minute": round((time.time() - launch) / 60, 2)})
        seen = len(lines)
        if not running:
            break
        time.sleep(5)
    if process.returncode != 0:
        raise SystemExit(f"benchmarks.dapo_race: {config_name}'s run failed (exit {process.returncode})")
    return rows


def strict_curve(rows: list[dict]) -> list[dict[str, float]]:
    """(minute, step, strict accuracy) of each validation: the reward mean less the overlong penalty, if logged."""
    curve = []
    for row in rows:
        reward = next((k for k in row if k.startswith("val-core/") and k.endswith("/reward/mean@1")), None)
        if reward is None:
            continue
        penalty = reward.replace("val-core/", "val-aux/").replace("/reward/", "/overlong_reward/")
        strict = row[reward] - row.get(penalty, 0.0)
        curve.append({"minute": row["_minute"], "step": int(row["step"]), "strict": round(strict, 4)})
    return curve


def summary(rows: list[dict], curve: list[dict[str, float]], train_batch_size: int, gain: float) -> dict[str, Any]:
    """The race's numbers for one run (module docstring)."""
    steps = [row for row in rows if "timing_s/step" in row]
    signal = [
        1.0 - row.get("training/filter_groups/frac_reward_zero_std", row.get("health/frac_reward_zero_std", 0.0))
        for row in steps
    ]
    per_minute = None
    if len(curve) > 1 and curve[-1]["minute"] > curve[0]["minute"]:
        per_minute = round((curve[-1]["strict"] - curve[0]["strict"]) / (curve[-1]["minute"] - curve[0]["minute"]), 4)
    return {
        "curve": curve,
        "strict_gain_per_minute": per_minute,
        "first_minute_at_gain": first_gain(curve, gain),
        "steps": len(steps),
        "trained_groups_with_signal": [round(s, 4) for s in signal],
        "trained_groups_with_signal_mean": _mean(signal),
        "generated_groups_with_signal_mean": _mean([1.0 - r.get("health/frac_reward_zero_std", 0.0) for r in steps]),
        "gen_batches_per_step_mean": _mean([r.get("train/num_gen_batches", 1.0) for r in steps]),
        "s_per_trained_prompt_mean": _mean([r["timing_s/step"] / train_batch_size for r in steps]),
    }


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from verl_compat.cli import load_config

    results = {}
    with tempfile.TemporaryDirectory(prefix="colorl-dapo-race-") as tmp:
        for name, preset in (("plain", args.plain), ("dapo", args.dapo)):
            overrides = colorl_overrides(args, str(Path(tmp) / name)) + (args.dapo_overrides if name == "dapo" else [])
            batch = load_config(overrides, config_name=preset).data.train_batch_size
            rows = run_preset(preset, overrides)
            results[name] = {"config_name": preset, **summary(rows, strict_curve(rows), batch, args.gain)}
    emit(
        {
            "benchmark": "dapo_race",
            "seed": args.seed,
            "minutes": args.minutes,
            "gain": args.gain,
            "data_dir": str(Path(args.data_dir).resolve()),
            "overrides": args.overrides,
            **results,
            "machine": machine(args.device),
        }
    )


if __name__ == "__main__":
    main()
