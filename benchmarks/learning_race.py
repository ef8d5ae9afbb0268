"""Learning per wall-clock minute: ColoRL's arith preset against TRL's GRPOTrainer on the same task, seed and budget.

    python -m data.preprocess.arith --out_dir DATA [--max_steps 2]      # the task (once)
    python -m benchmarks.learning_race --model-path DIR --data-dir DATA --seed 1 [--minutes 30]
                                       [--config-name smollm2_arith] [--set KEY=VALUE ...] [--no-trl | --no-colorl]

One after the other (never at once), each from its own launch: ``main.py --config-name smollm2_arith`` with the
seed (``trainer.seed``, ``data.seed``), the model, ``DATA/train.parquet`` and ``DATA/test.parquet``, for
``--minutes`` of training (``trainer.max_wall_time_s``: its clock starts once the workers are up; steps
unbounded); then TRL (``benchmarks.trl``, its own
venv) with the settings that config maps to (``benchmarks.trl.grpo_settings``: batch, sampling, LoRA,
learning rate and warm-up, precision, ...) on the same train file, evaluated as the preset validates: greedy
strict accuracy on the first ``data.val_max_samples`` held-out problems, at step 0 and every
``trainer.test_freq`` batches (in TRL's optimizer steps: that × the preset's mini-batches per batch), its
budget also counted from the start of training; the evaluations inside the budget for both, and each curve in
minutes since that contender's launch.

Prints JSON: for each contender the curve (minute since its launch, step, strict accuracy), the first minute at
which it reached ``--gain`` (default +0.30) over its step-0 accuracy, and its last point.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import emit, machine, stdout_to_stderr

REPO = Path(__file__).resolve().parent.parent
STRICT = "val-core/colorl/arith/reward/mean@1"  # the preset's validation: strict "#### N", greedy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", required=True, help="SmolLM2-135M-Instruct (python -m data.models.smollm2)")
    parser.add_argument("--data-dir", required=True, help="train.parquet and test.parquet (data.preprocess.arith)")
    parser.add_argument("--seed", type=int, default=1, help="trainer.seed and data.seed of both runs")
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-clock budget of each run")
    parser.add_argument("--gain", type=float, default=0.30, help="the held-out accuracy gain to time")
    parser.add_argument("--config-name", default="smollm2_arith", help="ColoRL's preset")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another ColoRL override (TRL follows it where it maps)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--no-trl", action="store_true", help="ColoRL's run only")
    parser.add_argument("--no-colorl", action="store_true", help="TRL's run only")
    parser.add_argument("--out-dir", help="keep the runs' outputs (metrics.jsonl, ...) here (default: a temporary one)")
    return parser.parse_args(argv)


def colorl_overrides(args: argparse.Namespace, out_dir: str) -> list[str]:
    """The preset's command-line overrides for this race: model, data, seed, the wall-clock budget."""
    data = Path(args.data_dir).resolve()
    return [
        f"actor_rollout_ref.model.path={Path(args.model_path).resolve()}",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}",
        f"trainer.seed={args.seed}",
        f"data.seed={args.seed}",
        f"trainer.device={args.device}",
        "trainer.total_training_steps=100000",
        f"trainer.max_wall_time_s={60 * args.minutes}",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={out_dir}",
        "trainer.resume_mode=disable",
        *args.overrides,
    ]


def race_colorl(args: argparse.Namespace, out_dir: str) -> list[dict[str, float]]:
    """``main.py`` with the preset; each validation as (minute since launch, step, strict accuracy), read from the
    file logger's metrics.jsonl while the run goes on."""
    metrics = Path(out_dir) / "metrics.jsonl"
    command = [sys.executable, "main.py", f"--config-name={args.config_name}", *colorl_overrides(args, out_dir)]
    launch, curve, seen = time.time(), [], 0
    process = subprocess.Popen(command, cwd=REPO, stdout=sys.stderr, stderr=sys.stderr)
    while True:
        running = process.poll() is None
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        for row in map(json.loads, lines[seen:]):
            if STRICT in row:
                curve.append(
                    {"minute": round((time.time() - launch) / 60, 2), "step": int(row["step"]), "strict": row[STRICT]}
                )
        seen = len(lines)
        if not running:
            break
        time.sleep(5)
    if process.returncode != 0:
        raise SystemExit(f"benchmarks.learning_race: ColoRL's run failed (exit {process.returncode})")
    return curve


def race_trl(args: argparse.Namespace, out_dir: str) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """TRL with the settings the preset maps to, greedy strict evaluations as the preset validates."""
    from benchmarks.trl import grpo_settings, run_trl
    from verl_compat.cli import load_config

    with stdout_to_stderr():
        cfg = load_config(colorl_overrides(args, out_dir), config_name=args.config_name)
    settings = grpo_settings(cfg, args.device, cfg.actor_rollout_ref.actor.use_kl_loss, 10**6, out_dir)
    optimizer_steps_per_batch = settings["grpo"]["steps_per_generation"] * settings["grpo"]["num_iterations"]
    evaluation = {
        "file": _first(cfg.data.val_files),
        "every": cfg.trainer.test_freq * optimizer_steps_per_batch,
        "limit": cfg.data.val_max_samples,
        "max_new_tokens": int(cfg.data.max_response_length),
    }
    evals, summary = run_trl(
        settings,
        cfg.actor_rollout_ref.model.path,
        _first(cfg.data.train_files),
        threads=os.cpu_count() or 1,
        warmup=1,
        eval=evaluation,
        launch_time=time.time(),
        minutes=args.minutes,
    )
    for point in evals:  # TRL counts optimizer steps; ColoRL's steps are batches
        point["step"] = point["step"] / optimizer_steps_per_batch
    return evals, summary


def _first(files: str | list[str]) -> str:
    return files if isinstance(files, str) else files[0]


def first_gain(curve: list[dict[str, float]], gain: float) -> float | None:
    """The first minute at which the accuracy is ``gain`` above the curve's first point (None: never)."""
    if not curve:
        return None
    return next((p["minute"] for p in curve if p["strict"] >= curve[0]["strict"] + gain - 1e-9), None)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="colorl-race-") as scratch:
        tmp = args.out_dir or scratch
        if not args.no_colorl:
            results["colorl"] = {"curve": race_colorl(args, str(Path(tmp) / "colorl"))}
        if not args.no_trl:
            curve, summary = race_trl(args, str(Path(tmp) / "trl"))
            results["trl"] = {
                "curve": curve,
                "s_per_optimizer_step": summary["s_per_step"],
                "peak_rss_mb": summary["peak_rss_mb"],
            }
    for result in results.values():
        result["first_minute_at_gain"] = first_gain(result["curve"], args.gain)
        result["last"] = result["curve"][-1] if result["curve"] else None
    emit(
        {
            "benchmark": "learning_race",
            "config_name": args.config_name,
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
