"""On-policy distillation against GRPO on the SmolLM2 arithmetic problems, and what the teacher costs a step.

    # the teacher: GRPO on seed 0's problems, exported as one model directory (conf/smollm2_opd.yaml's header)
    python -m data.preprocess.arith --out_dir DATA
    python main.py --config-name smollm2_arith data.train_files=DATA/train.parquet data.val_files=DATA/test.parquet \\
        trainer.experiment_name=arith_teacher
    python -m trainer.export outputs/colorl/arith_teacher --out TEACHER
    # problems of a seed the teacher never trained on
    python -m data.preprocess.arith --out_dir HELDOUT --seed 1 --train_size 0 --test_size 500
    python -m benchmarks.opd_race race --model-path STUDENT --teacher-path TEACHER --data-dir DATA \\
        --heldout HELDOUT/test.parquet --seed 1 [--minutes 15] [--set KEY=VALUE ...] [--opd-set KEY=VALUE ...]
    python -m benchmarks.opd_race cost --model-path STUDENT --teacher-path TEACHER --data-dir DATA \\
        [--steps 10 --warmup 2] [--set KEY=VALUE ...]

``race``: GRPO (``--grpo``, default ``smollm2_arith``) and OPD (``--opd``, default ``smollm2_opd``) one after the
other, each from its own launch with the untrained student, the same seed, training problems (``DATA/train.parquet``,
the teacher's) and wall-clock budget (``benchmarks.learning_race.colorl_overrides``). Both validate on the held-out
problems: the rows of ``--heldout`` whose calculation is in no training row (a seed's problems repeat other seeds'
calculations in other stories; the expression is the problem), the first ``data.val_max_samples`` of them, greedy
strict ``#### N``. It reports each run's strict accuracy curve (minute since launch, step, accuracy), its start,
last and gain, the gain per minute, the first minute at ``--gain`` over the start, steps taken, seconds per step and
peak RSS; for OPD also the teacher's seconds a step; and the teacher's own held-out accuracy
(``benchmarks.greedy_accuracy``) for reference.

``cost``: the OPD preset with and without the teacher, in one process each (``benchmarks.step``'s loop, a fresh Ray
and fresh workers per variant), ``--warmup`` then ``--steps`` steps at a learning rate of 1e-30: the weights do not
move, so both sample the very same responses and the step times differ by the teacher's forward and the
distillation loss alone. It reports the medians of step time and of the teacher's phase, the overhead
(with / without − 1), each variant's peak RSS per worker, their difference, and the teacher's weights per worker
as placed (its FSDP shard in its compute dtype, ``trainer.preflight.memory_estimate.Placement``).

Prints JSON (``benchmarks.common.emit``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import emit, machine, stdout_to_stderr
from benchmarks.dapo_race import run_preset, strict_curve
from benchmarks.learning_race import colorl_overrides, first_gain

TEACHER_PATH = "distillation.teacher_models.teacher_model.model_path"
FROZEN = "actor_rollout_ref.actor.optim.lr=1e-30"  # positive (the schema's rule), far below any weight's rounding


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["race", "cost"])
    parser.add_argument("--model-path", required=True, help="the student: SmolLM2-135M-Instruct, untrained")
    parser.add_argument("--teacher-path", required=True, help="the teacher: SmolLM2 after GRPO (trainer.export)")
    parser.add_argument("--data-dir", required=True, help="train.parquet (the teacher's problems) and test.parquet")
    parser.add_argument("--heldout", help="race: problems of another seed (data.preprocess.arith --seed S)")
    parser.add_argument("--seed", type=int, default=1, help="trainer.seed and data.seed of every run")
    parser.add_argument("--minutes", type=float, default=15.0, help="race: the wall-clock budget of each run")
    parser.add_argument("--gain", type=float, default=0.30, help="race: the held-out accuracy gain to time")
    parser.add_argument("--grpo", default="smollm2_arith", help="the GRPO preset")
    parser.add_argument("--opd", default="smollm2_opd", help="the distillation preset")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="every run")
    parser.add_argument("--opd-set", dest="opd_overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--no-teacher-eval", action="store_true", help="race: skip the teacher's own accuracy")
    parser.add_argument("--steps", type=int, default=10, help="cost: measured steps per variant")
    parser.add_argument("--warmup", type=int, default=2, help="cost: unmeasured steps first")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args(argv)
    if args.mode == "race" and not args.heldout:
        parser.error("race needs --heldout (a test.parquet of problems from another seed)")
    return args


def problem(row: dict[str, Any]) -> str:
    """What makes two rows the same problem: the arithmetic problems' calculation (``extra_info.answer`` up to its
    " = "), whatever story tells it; another task's prompt as a whole."""
    answer = (row.get("extra_info") or {}).get("answer")
    return answer.split(" = ")[0] if answer else json.dumps(row["prompt"], sort_keys=True, default=str)


def held_out(test_file: str, train_file: str, out: Path) -> int:
    """Write the rows of ``test_file`` whose problem (``problem``) is in no row of ``train_file`` to ``out``; how
    many."""
    seen = {problem(row) for row in pq.read_table(train_file).to_pylist()}
    table = pq.read_table(test_file)
    keep = [i for i, row in enumerate(table.to_pylist()) if problem(row) not in seen]
    pq.write_table(table.take(pa.array(keep, type=pa.int64())), out)
    return len(keep)


def race_summary(rows: list[dict], gain: float) -> dict[str, Any]:
    """One run's numbers (module docstring) from its metrics.jsonl rows (``dapo_race.run_preset``'s)."""
    curve, steps = strict_curve(rows), [row for row in rows if "timing_s/step" in row]
    start, last = (curve[0], curve[-1]) if curve else (None, None)
    per_minute = None
    if start and last["minute"] > start["minute"]:
        per_minute = round((last["strict"] - start["strict"]) / (last["minute"] - start["minute"]), 4)
    return {
        "curve": curve,
        "start": start,
        "last": last,
        "strict_gain": round(last["strict"] - start["strict"], 4) if curve else None,
        "strict_gain_per_minute": per_minute,
        "first_minute_at_gain": first_gain(curve, gain),
        "steps": len(steps),
        "s_per_step_mean": _mean([row["timing_s/step"] for row in steps]),
        "teacher_s_per_step_mean": _mean([row["timing_s/teacher"] for row in steps if "timing_s/teacher" in row]),
        "distillation_loss_first_last": [steps[i]["distillation/loss"] for i in (0, -1)]
        if steps and "distillation/loss" in steps[0]
        else None,
        "peak_rss_gb_per_worker": round(max(row.get("perf/cpu_memory_peak_gb", 0.0) for row in steps), 3)
        if steps
        else None,
    }


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def teacher_accuracy(args: argparse.Namespace, heldout: Path, cfg: Any) -> dict[str, Any]:
    """The teacher's greedy strict accuracy on the runs' validation rows (``benchmarks.greedy_accuracy``)."""
    limit = cfg.data.val_max_samples if cfg.data.val_max_samples > 0 else 10**9
    command = [sys.executable, "-m", "benchmarks.greedy_accuracy", "--model", args.teacher_path, "--data"]
    command += [str(heldout), "--limit", str(limit), "--max-new-tokens", str(cfg.data.max_response_length)]
    command += ["--device", args.device, "--show", "0"]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    out = json.loads(result.stdout)
    return {"accuracy": out["accuracy"], "rows": out["rows"]}


def race(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from verl_compat.cli import load_config

    data = Path(args.data_dir).resolve()
    heldout = tmp / "heldout.parquet"
    rows = held_out(args.heldout, str(data / "train.parquet"), heldout)
    results: dict[str, Any] = {"heldout_rows": rows}
    for name, preset in (("grpo", args.grpo), ("opd", args.opd)):
        overrides = [o for o in colorl_overrides(args, str(tmp / name)) if not o.startswith("data.val_files=")]
        overrides.insert(0, f"data.val_files={heldout}")  # before --set, which may still change it
        if name == "opd":
            overrides += [f"{TEACHER_PATH}={Path(args.teacher_path).resolve()}", *args.opd_overrides]
        with stdout_to_stderr():
            cfg = load_config(overrides, config_name=preset)
        results[name] = {"config_name": preset, **race_summary(run_preset(preset, overrides), args.gain)}
    if not args.no_teacher_eval:
        results["teacher"] = teacher_accuracy(args, heldout, cfg)
    return results


def cost(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The OPD preset with and without its teacher, frozen weights (module docstring)."""
    import ray

    from benchmarks.step import run_steps, start_ray, summarize
    from trainer.running.build import build_trainer
    from verl_compat.cli import load_config, num_workers

    settings = [f"{TEACHER_PATH}={Path(args.teacher_path).resolve()}", FROZEN, "trainer.val_before_train=false"]
    out: dict[str, Any] = {}
    for variant, extra in (("without_teacher", ["distillation.enabled=false"]), ("with_teacher", [])):
        overrides = [*colorl_overrides(args, str(tmp / variant)), *settings, *extra, *args.opd_overrides]
        with stdout_to_stderr():
            cfg = load_config(overrides, config_name=args.opd)
            trainer = build_trainer(cfg)
        workers = num_workers(cfg)
        start_ray(workers, args.device)
        try:
            with stdout_to_stderr():
                trainer.init_workers()
            measured = run_steps(trainer, args.warmup, args.steps)
        finally:
            ray.shutdown()
        sequences = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n
        out[variant] = summarize(measured, sequences, workers)
    with_t, without = out["with_teacher"], out["without_teacher"]
    return {
        **out,
        "overhead": round(with_t["s_per_step"] / without["s_per_step"] - 1, 4),
        "teacher_s_per_step": with_t["timing_s"].get("teacher"),
        "peak_rss_gb_per_worker_delta": round(with_t["peak_rss_gb_per_worker"] - without["peak_rss_gb_per_worker"], 3),
        "teacher_weights_mb_per_worker": teacher_weights_mb(trainer.config, trainer.plan, args.device),
    }


def teacher_weights_mb(cfg: Any, plan: Any, device: str) -> float:
    """The teacher's weights one worker holds as placed (its shard in its compute dtype), in MiB."""
    from trainer.preflight.dry_run import load_model_sizes
    from trainer.preflight.memory_phases import roles_on_worker

    teacher = roles_on_worker(cfg, plan, load_model_sizes(cfg, plan, lambda: None), device)["teacher"]
    return round(teacher.placement.persistent(teacher.sizes, False) / 2**20, 3)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="colorl-opd-race-") as tmp:
        results = (race if args.mode == "race" else cost)(args, Path(tmp))
    emit(
        {
            "benchmark": "opd_race",
            "mode": args.mode,
            "seed": args.seed,
            "minutes": args.minutes if args.mode == "race" else None,
            "data_dir": str(Path(args.data_dir).resolve()),
            "teacher_path": str(Path(args.teacher_path).resolve()),
            "overrides": args.overrides,
            "opd_overrides": args.opd_overrides,
            **results,
            "machine": machine(args.device),
        }
    )


if __name__ == "__main__":
    main()
