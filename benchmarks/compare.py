"""The ratios of docs/benchmarks.md in one run: ColoRL against its compute floor and against TRL.

    python -m benchmarks.compare [--hidden 128 --layers 2 --response-length 8 ...] [--rounds 3]
                                 [--workers 1 2] [--algo grpo|ppo] [--kl] [--no-trl] [--set KEY=VALUE ...]

Runs ``floor``, ``step`` (once per worker count) and ``trl`` with the same flags, one after the other, and
repeats that round ``--rounds`` times, so slow and fast moments of a shared machine fall on every side of a
ratio. Each benchmark is its own process (never two at once: on a small machine they would slow each other).
Prints JSON: every round's s/step, the per-round ratios and their medians:

- ``colorl_w<k>_over_floor``: ColoRL step with k workers / the floor that applies (``floor``'s ``floor_s``:
  gen + train + the forwards the trainer runs — ref with a KL, values with a critic, old log-probs unless the
  update is one on-policy step);
- ``colorl_w<k>_over_trl``: ColoRL / TRL GRPOTrainer s/step (below 1: ColoRL is faster);
- ``w<k>_over_w<first>``: the step time of k workers over that of the first worker count.

Each round also keeps the per-phase medians (``phases_s``) of the floor and of every ColoRL run, so a ratio
can be traced to the phase that moved, and their model FLOPs utilisation (``mfu``: the floor's and each
ColoRL run's whole step, ``workers.runtime.perf``; on a CPU against a measured matmul rate, on a known GPU its
datasheet peak). ``best_ratios`` are the same ratios taken between each contender's
fastest round (its lowest s/step): on a shared machine other processes only ever add time, so the minimum is
the least disturbed estimate of each contender's own cost (``timeit``'s rule); the medians are the default.
Each round also reports ``response_tokens_per_s`` (non-pad response tokens sampled per second of the floor, or
of a ColoRL step) and ``peak_rss_gb_per_worker`` (the floor's process, the mean of ColoRL's worker processes);
the output has their medians and, for the memory, the highest round. TRL's figures sit beside them under
``trl`` (completion tokens/s and its process's peak RSS), so ``median_response_tokens_per_s`` answers "how many
times TRL's throughput" directly.

LoRA: ``--set actor_rollout_ref.model.lora_rank=16 --set actor_rollout_ref.model.lora_alpha=32`` reaches every
benchmark of the round, so the floor then does a LoRA step's work too: the same peft adapters
(``workers.parallel.lora.add_adapters``), AdamW over them only, and with a KL the reference log-probs from the policy
with its adapters off instead of a second model; TRL trains peft adapters of the same rank, alpha and target
modules (``benchmarks.trl``). The same command without those two flags gives the full fine-tuning figures;
``overrides`` in the output tells the runs apart. Every setting TRL gets comes from the same ColoRL config
(``benchmarks.trl.grpo_settings``): learning rate, temperature, precision, compilation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import add_batch_args, add_model_args, emit, machine

REPO = Path(__file__).resolve().parent.parent
SHARED = (
    "hidden",
    "layers",
    "sft_warmup_steps",
    "task",
    "cache_dir",
    "model_path",
    "vocab_size",
    "algo",
    "kl",
    "prompts",
    "n",
    "prompt_length",
    "response_length",
    "steps",
    "warmup",
    "device",
    "seed",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    add_batch_args(parser)
    parser.add_argument("--rounds", type=int, default=3, help="repetitions of floor, step(s), trl")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="ColoRL worker counts")
    parser.add_argument("--no-trl", action="store_true", help="leave TRL out (it needs its own venv)")
    return parser.parse_args(argv)


def shared_flags(args: argparse.Namespace) -> list[str]:
    """The flags every benchmark of a round gets: a switch when on, a value when set."""
    flags = []
    for name in SHARED:
        value, flag = getattr(args, name), f"--{name.replace('_', '-')}"
        if value is True:
            flags.append(flag)
        elif value is not None and value is not False:
            flags += [flag, str(value)]
    return flags + [f"--set={o}" for o in args.overrides]


def run(name: str, flags: list[str]) -> dict[str, Any]:
    """``python -m benchmarks.<name> flags`` -> its JSON line."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *flags],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"benchmarks.{name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def one_round(args: argparse.Namespace) -> dict[str, Any]:
    """This round's s/step of every contender (the floor: the one that applies), the floor's and ColoRL's phases,
    MFU (the floor's, and each ColoRL run's whole step), response tokens/s and peak RSS per process."""
    flags = shared_flags(args)
    floor = run("floor", [*flags, "--threads", str(os.cpu_count())])
    row = {"floor": floor["floor_s"]}
    phases = {"floor": floor["timing_s"]}
    mfu = {"floor": floor["perf"]["mfu/floor"]}
    tokens_per_s = {"floor": floor["response_tokens_per_s_floor"]}
    peak_rss = {"floor": floor["peak_rss_gb"]}
    for workers in args.workers:
        step = run("step", [*flags, "--workers", str(workers)])
        name = f"colorl_w{workers}"
        row[name], phases[name], mfu[name] = step["s_per_step"], step["timing_s"], step["perf"]["mfu/step"]
        tokens_per_s[name], peak_rss[name] = step["response_tokens_per_s"], step["peak_rss_gb_per_worker"]
    if not args.no_trl:
        trl = run("trl", [*flags, "--threads", str(os.cpu_count())])
        row["trl"], tokens_per_s["trl"] = trl["s_per_step"], trl["completion_tokens_per_s"]
        peak_rss["trl"] = round(trl["peak_rss_mb"] / 1024, 3)
    return {
        "s_per_step": row,
        "ratios": ratios(row, args.workers),
        "phases_s": phases,
        "mfu": mfu,
        "response_tokens_per_s": tokens_per_s,
        "peak_rss_gb_per_worker": peak_rss,
    }


def ratios(row: dict[str, float], workers: list[int]) -> dict[str, float]:
    out = {}
    for k in workers:
        colorl = row[f"colorl_w{k}"]
        out[f"colorl_w{k}_over_floor"] = colorl / row["floor"]
        if "trl" in row:
            out[f"colorl_w{k}_over_trl"] = colorl / row["trl"]
        if k != workers[0]:
            out[f"w{k}_over_w{workers[0]}"] = colorl / row[f"colorl_w{workers[0]}"]
    return {key: round(value, 3) for key, value in out.items()}


def best_ratios(rows: list[dict[str, float]], workers: list[int]) -> dict[str, float]:
    """The ratios between each contender's fastest round (rows: one s/step dict per round)."""
    return ratios({k: min(row[k] for row in rows) for k in rows[0]}, workers)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rounds = []
    for i in range(args.rounds):
        rounds.append(one_round(args))
        print(f"[compare] round {i + 1}/{args.rounds}: {json.dumps(rounds[-1])}", file=sys.stderr, flush=True)
    keys = rounds[0]["ratios"].keys()
    emit(
        {
            "benchmark": "compare",
            "algo": args.algo,
            "kl": args.kl,
            "hidden": args.hidden,
            "layers": args.layers,
            "prompts": args.prompts,
            "n": args.n,
            "response_length": args.response_length,
            "steps": args.steps,
            "rounds": args.rounds,
            "overrides": args.overrides,
            "median_ratios": {k: round(statistics.median(r["ratios"][k] for r in rounds), 3) for k in keys},
            "median_s_per_step": {
                k: round(statistics.median(r["s_per_step"][k] for r in rounds), 4) for k in rounds[0]["s_per_step"]
            },
            "best_ratios": best_ratios([r["s_per_step"] for r in rounds], args.workers),
            "median_mfu": {k: round(statistics.median(r["mfu"][k] for r in rounds), 4) for k in rounds[0]["mfu"]},
            "median_response_tokens_per_s": {
                k: round(statistics.median(r["response_tokens_per_s"][k] for r in rounds), 1)
                for k in rounds[0]["response_tokens_per_s"]
            },
            "max_peak_rss_gb_per_worker": {
                k: max(r["peak_rss_gb_per_worker"][k] for r in rounds) for k in rounds[0]["peak_rss_gb_per_worker"]
            },
            "rounds_detail": rounds,
            "machine": machine(args.device),
        }
    )


if __name__ == "__main__":
    main()
