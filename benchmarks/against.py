"""The same command in this tree and in a checkout of another commit, alternating, one round after the other.

    python -m benchmarks.against --ref a30b1cf [--rounds 3] [--warmup 1] -- python main.py --config-name \
        smollm2_arith trainer.total_training_steps=4 ... trainer.default_local_dir={out}

The other commit is checked out once with ``git worktree add --detach`` (under ``--ref-dir``, default
``/tmp/colorl-<ref>``) and runs with this tree's interpreter (the dependencies are the same), its own code first on
``PYTHONPATH``. ``python`` at the head of the command is that interpreter. Each run gets a fresh directory for
``{out}``; the runs never overlap.

What is read back:
- a command with ``{out}`` is a training run (``main.py`` with ``trainer.logger`` including ``file``): its
  ``{out}/metrics.jsonl`` gives each step's ``timing_s/*``, ``response_length/mean`` and the workers' peak RSS
  (``perf/cpu_memory_peak_gb``); the first ``--warmup`` steps are left out;
- any other command prints one JSON object last on stdout (``python -m benchmarks.step ...``): its numeric
  top-level values are kept as they are.

Prints JSON: each round's figures for ``ref`` and ``head``, their medians over rounds, and the median over rounds
of each figure's head / ref ratio (a step time of 0.5 is twice as fast).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import emit, machine

REPO = Path(__file__).resolve().parent.parent
STEP_KEYS = ("timing_s/", "response_length/mean")  # per-step figures whose medians are kept


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", required=True, help="the commit to compare with (e.g. a30b1cf)")
    parser.add_argument("--ref-dir", default=None, help="where its checkout lives (default /tmp/colorl-<ref>)")
    parser.add_argument("--rounds", type=int, default=3, help="ref then head, this many times")
    parser.add_argument("--warmup", type=int, default=1, help="training steps left out of each run's medians")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command, the same for both")
    args = parser.parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.command:
        parser.error("give the command after --")
    return args


def checkout(ref: str, where: str | None) -> Path:
    """A detached worktree of ``ref`` (made once; an existing one is reused as it is)."""
    path = Path(where or f"/tmp/colorl-{ref}")
    if not (path / ".git").exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), ref], cwd=REPO, check=True, stdout=sys.stderr)
    return path


def run_in(tree: Path, command: list[str], warmup: int) -> dict[str, float]:
    """Run ``command`` in ``tree``; the figures it gives (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="colorl-against-") as out:
        argv = [
            sys.executable if i == 0 and word == "python" else word.replace("{out}", out)
            for i, word in enumerate(command)
        ]
        env = {**os.environ, "PYTHONPATH": str(tree), "TOKENIZERS_PARALLELISM": "false"}
        result = subprocess.run(argv, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
        if result.returncode != 0:
            raise SystemExit(f"benchmarks.against: `{' '.join(argv)}` failed in {tree} (exit {result.returncode})")
        if any("{out}" in word for word in command):
            return step_figures(Path(out) / "metrics.jsonl", warmup)
        last = json.loads(result.stdout.strip().splitlines()[-1])
        return {k: v for k, v in last.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def step_figures(metrics_path: Path, warmup: int) -> dict[str, float]:
    """Medians of each step's timings and response length after ``warmup`` steps, and the run's peak worker RSS."""
    steps = [row for row in map(json.loads, metrics_path.read_text().splitlines()) if "timing_s/step" in row]
    measured = steps[warmup:] or steps
    keys = sorted({k for row in measured for k in row if k.startswith(STEP_KEYS)})
    figures = {k: statistics.median(row[k] for row in measured if k in row) for k in keys}
    figures["perf/cpu_memory_peak_gb"] = max(row.get("perf/cpu_memory_peak_gb", 0.0) for row in steps)
    figures["steps_measured"] = len(measured)
    return figures


def summarize(rounds: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Per figure: the median over rounds of ref and head, and the median of the per-round head / ref ratios."""
    keys = sorted(set(rounds[0]["ref"]) & set(rounds[0]["head"]))
    medians = {side: {k: statistics.median(r[side][k] for r in rounds) for k in keys} for side in ("ref", "head")}
    ratios = {
        k: round(statistics.median(r["head"][k] / r["ref"][k] for r in rounds), 3)
        for k in keys
        if all(r["ref"][k] for r in rounds)
    }
    return {"median": medians, "median_head_over_ref": ratios}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    trees = {"ref": checkout(args.ref, args.ref_dir), "head": REPO}
    rounds = []
    for i in range(args.rounds):
        rounds.append({side: run_in(tree, args.command, args.warmup) for side, tree in trees.items()})
        print(f"[against] round {i + 1}/{args.rounds}: {json.dumps(rounds[-1])}", file=sys.stderr, flush=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    emit(
        {
            "benchmark": "against",
            "ref": args.ref,
            "head": head.stdout.strip(),
            "command": args.command,
            "rounds": rounds,
            **summarize(rounds),
            "machine": machine("cpu"),
        }
    )


if __name__ == "__main__":
    main()
