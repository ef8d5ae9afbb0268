"""sync against separate_async on the demo (``python main.py``): trained samples per second, same seed, data, steps.

Both runs use the same 2 CPU workers: sync trains and generates on both (data-parallel), separate_async trains on one
while the other generates the next batch (``trainer.v1.trainer_mode=separate_async``, 1 + 1 workers). The runs
alternate (sync, async, sync, ...) so that load from other processes on the machine falls on both alike. Each run's
rate is its sequences trained after ``--warmup`` steps over the sum of those steps' ``timing_s/step`` (validation and
checkpoints off); the per-phase medians are the profile that says where a step's time goes.

    python -m benchmarks.async_modes [override ...] --steps 25 --rounds 3 [--config-name smollm2_arith]
                                     [--modes sync separate_async colocate_async]

(config overrides first: ``--modes`` takes the words after it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = {
    "sync": ["trainer.n_gpus_per_node=2"],
    "separate_async": [
        "trainer.n_gpus_per_node=1",
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.parameter_sync_step=1",  # the demo's one update a step
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
    ],
    "colocate_async": ["trainer.n_gpus_per_node=2", "trainer.v1.trainer_mode=colocate_async"],
}
PHASES = ("step", "gen", "worker_gen", "reward", "old_log_prob", "update_actor", "update_weights")


def run(mode: str, steps: int, extra: list[str], root: Path, config_name: str | None = None) -> list[dict]:
    """One training run of ``mode`` (of the preset ``config_name``); its metrics records, one a step."""
    out = root / f"{mode}-{len(list(root.iterdir()))}"
    overrides = [*MODES[mode], f"trainer.total_training_steps={steps}", "trainer.test_freq=-1"]
    overrides += ["trainer.save_freq=-1", "trainer.val_before_train=false", "trainer.logger=[file]"]
    overrides += [f"trainer.default_local_dir={out}", *extra]
    preset = [f"--config-name={config_name}"] if config_name else []
    subprocess.run([sys.executable, "main.py", *preset, *overrides], check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summary(records: list[dict], warmup: int, sequences: int) -> dict[str, float]:
    """Trained sequences per second after ``warmup`` steps (``sequences`` a step), the last 5 steps' mean score,
    the mean response length, each phase's median seconds, the mean staleness and span (async)."""
    steps = [r for r in records if r.get("step", 0) > warmup and "timing_s/step" in r]
    seconds = sum(r["timing_s/step"] for r in steps)
    result = {
        "samples_per_s": sequences * len(steps) / seconds,
        "score_last5": statistics.mean(r["critic/score/mean"] for r in steps[-5:]),
        "response_length": statistics.mean(r["response_length/mean"] for r in steps),
    }
    for phase in PHASES:
        values = [r[f"timing_s/{phase}"] for r in steps if f"timing_s/{phase}" in r]
        if values:
            result[f"{phase}_s"] = statistics.median(values)
    for name in ("staleness", "spans"):
        key = f"training/off_policy/trajectory_{name}/mean"
        values = [r[key] for r in steps if key in r]
        if values:
            result[name] = statistics.mean(values)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["sync", "separate_async"], choices=list(MODES))
    parser.add_argument("--sequences", type=int, default=128, help="sequences a step: train_batch_size × rollout.n")
    parser.add_argument("--config-name", default=None, help="a preset of conf/ (default: the demo)")
    parser.add_argument("overrides", nargs="*", help="more config overrides for both modes")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {mode: [] for mode in args.modes}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for mode in args.modes:
                results[mode].append(
                    summary(
                        run(mode, args.steps, args.overrides, Path(tmp), args.config_name), args.warmup, args.sequences
                    )
                )
                print(mode, json.dumps(results[mode][-1]), file=sys.stderr, flush=True)
    medians = {mode: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for mode, rows in results.items()}
    for mode in args.modes[1:]:
        medians[f"{mode}/{args.modes[0]}"] = medians[mode]["samples_per_s"] / medians[args.modes[0]]["samples_per_s"]
    print(json.dumps(medians, indent=1))


if __name__ == "__main__":
    main()
