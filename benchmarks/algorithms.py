"""One training step on the built-in toy for every advantage estimator, policy loss and loss aggregation mode,
each through ``main.py`` (its own Ray start): the keys each one reads, and whether the step's metrics are finite.

    python -m benchmarks.algorithms [--only NAME ...] [--workers 2] [--out DIR] [--table]

``--table`` prints the table of docs/algorithms.md from the registries and runs
nothing. Otherwise each case runs ``python main.py <its keys> trainer.total_training_steps=1 …``, one line
per case, then the table with the step's actor/pg_loss and actor/grad_norm (``--json``: JSON instead).
``bypass_mode`` runs on the rollout's log-probs (``rollout.calculate_log_probs``), as verl's bypass mode does.
GDPO scores with ``two_part_score`` below, the toy's score split into two components.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from algos import ADV_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES
from config.sections import PolicyLossConfig
from data.tasks import default_compute_score
from trainer.observing.tracking import read_metrics

ROOT = Path(__file__).resolve().parent.parent
ACTOR, LOSS_KEYS = "actor_rollout_ref.actor", {f.name for f in dataclasses.fields(PolicyLossConfig)}
EXTRA = {  # what a name needs on top of selecting it
    "gdpo": [
        f"reward.custom_reward_function.path={Path(__file__).resolve()}",
        "reward.custom_reward_function.name=two_part_score",
        "algorithm.gdpo_reward_keys=[correct,stopped]",
    ],
    "dro": [f"{ACTOR}.policy_loss.dro_beta=0.1"],
    "bypass_mode": [
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "algorithm.rollout_correction.bypass_mode=true",
    ],
}


def two_part_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> dict:
    """The built-in task's score, plus its two parts for GDPO: correct, and stopped by itself (eos)."""
    score = default_compute_score(data_source, solution_str, ground_truth, extra_info)
    score = float(score["score"] if isinstance(score, dict) else score)
    return {"score": score, "correct": score, "stopped": float(bool((extra_info or {}).get("stopped_by_eos", True)))}


def cases() -> list[dict[str, Any]]:
    """kind, name, the keys it reads, the inputs it needs (phases of the step), overrides: every estimator, policy
    loss and loss aggregation mode."""
    out = []
    for name, entry in ADV_ESTIMATORS.items():
        reads = [f"algorithm.{o}" for o in entry.options]
        reads += ["algorithm.gdpo_reward_keys"] if "reward_components" in entry.needs else []
        out.append(
            dict(
                kind="estimator",
                name=name,
                reads=reads,
                needs=list(entry.needs),
                overrides=[f"algorithm.adv_estimator={name}"],
            )
        )
    for name, loss in POLICY_LOSSES.items():
        reads = [f"{ACTOR}.{'policy_loss.' if o.partition('.')[0] in LOSS_KEYS else ''}{o}" for o in loss.options]
        reads += [] if loss.agg_mode else [f"{ACTOR}.loss_agg_mode"]
        out.append(
            dict(
                kind="policy loss",
                name=name,
                reads=reads,
                needs=list(loss.needs),
                note=f"always {loss.agg_mode}" if loss.agg_mode else "",
                overrides=[f"{ACTOR}.policy_loss.loss_mode={name}", f"{ACTOR}.skip_on_policy_old_log_prob=false"],
            )
        )
    for mode in LOSS_AGG_MODES:
        reads = [f"{ACTOR}.loss_scale_factor"] if mode == "seq-mean-token-sum-norm" else []
        out.append(
            dict(kind="aggregation", name=mode, reads=reads, needs=[], overrides=[f"{ACTOR}.loss_agg_mode={mode}"])
        )
    for case in out:
        case["overrides"] += EXTRA.get(case["name"], [])
    return out


def run_case(case: dict[str, Any], workers: int, out_dir: Path) -> dict[str, Any]:
    """One step through main.py; the result: status, seconds, the step's metrics or the config error's line."""
    local_dir = out_dir / f"{case['kind'].replace(' ', '_')}-{case['name']}"
    command = [
        sys.executable,
        "main.py",
        *case["overrides"],
        "trainer.total_training_steps=1",
        "trainer.logger=[file]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        f"trainer.n_gpus_per_node={workers}",
        f"trainer.default_local_dir={local_dir}",
    ]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return dict(status=f"exit {proc.returncode}", seconds=seconds, error=last)
    record = read_metrics(local_dir / "metrics.jsonl")[-1]
    numbers = {k: v for k, v in record.items() if isinstance(v, (int, float))}
    bad = sorted(k for k, v in numbers.items() if not math.isfinite(v))
    return dict(
        status="finite" if not bad else f"non-finite: {bad}",
        seconds=seconds,
        pg_loss=numbers.get("actor/pg_loss"),
        grad_norm=numbers.get("actor/grad_norm"),
    )


def table(results: dict[str, dict[str, Any]] | None = None) -> str:
    lines = [
        "| kind | name | keys it reads (`actor` = actor_rollout_ref.actor) | needs | one step on the toy |",
        "|---|---|---|---|---|",
    ]
    for case in cases():
        result = (results or {}).get(f"{case['kind']}:{case['name']}")
        if result is None:
            step = ""
        elif "error" in result:
            step = f"{result['status']}: {result['error']}"
        else:
            step = f"{result['status']}; pg_loss {result['pg_loss']:.4g}, grad_norm {result['grad_norm']:.3g}"
        keys = ", ".join(filter(None, [_keys(case["reads"]), case.get("note", "")])) or "—"
        lines.append(f"| {case['kind']} | `{case['name']}` | {keys} | {', '.join(case['needs']) or '—'} | {step} |")
    return "\n".join(lines)


def _keys(reads: list[str]) -> str:
    """``actor.{clip_ratio_low, clip_ratio_high}``: keys grouped by section."""
    groups: dict[str, list[str]] = {}
    for key in reads:
        key = key.replace(f"{ACTOR}.policy_loss.rollout_correction.", "algorithm.rollout_correction.")
        section, _, name = key.replace(f"{ACTOR}.", "actor.").rpartition(".")
        groups.setdefault(section, []).append(name)
    return ", ".join(f"`{s}.{n[0]}`" if len(n) == 1 else f"`{s}.{{{', '.join(n)}}}`" for s, n in groups.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="run only these names")
    parser.add_argument("--workers", type=int, default=2, help="trainer.n_gpus_per_node")
    parser.add_argument("--out", default="outputs/bench_algorithms", help="a directory per invocation under it")
    parser.add_argument("--table", action="store_true", help="print the table of keys only; run nothing")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    if args.table:
        print(table())
        return
    results, failed = {}, []
    out_dir = Path(args.out).resolve() / time.strftime("%Y%m%d-%H%M%S")  # two invocations never share a run dir
    for case in cases():
        if args.only is not None and case["name"] not in args.only:
            continue
        key = f"{case['kind']}:{case['name']}"
        results[key] = result = run_case(case, args.workers, out_dir)
        if result["status"] != "finite":
            failed.append(key)
        print(f"{key}: {result['status']} ({result['seconds']:.0f} s) {result.get('error', '')}", flush=True)
    print(json.dumps(results, indent=1) if args.json else table(results))
    if failed:
        sys.exit(f"not as expected: {failed}")


if __name__ == "__main__":
    main()
