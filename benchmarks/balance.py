"""What ``trainer.balance_batch`` does on several workers: the tokens per worker and the step's phases, with the
driver's reordering on and off, on the same batches (same seed).

    python -m benchmarks.balance [--workers 2] [--prompts 16 --n 8] [--response-length 64] [--steps 10 --warmup 2]

Runs the real trainer (``benchmarks.step``'s loop) twice, ``trainer.balance_batch=false`` then ``true``, and
prints JSON: per setting the medians of the step and of each phase (``timing_s/*``), and of verl's
``global_seqlen/*`` metrics (the tokens of the most and least loaded worker before and after the reordering);
``speedup`` is the step time without balancing over the step time with it. Uneven lengths come from sampling:
an untrained built-in model (``--sft-warmup-steps 0``, the default here) answers with random lengths up to the limit.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from typing import Any

from benchmarks.common import (
    add_batch_args,
    add_model_args,
    emit,
    load_bench_config,
    machine,
    medians,
    stdout_to_stderr,
)
from benchmarks.step import run_steps, start_ray


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    add_batch_args(parser, steps=10, warmup=2)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (GPUs on CUDA)")
    parser.set_defaults(sft_warmup_steps=0, response_length=64)
    return parser.parse_args(argv)


def measure(args: argparse.Namespace, balance: bool) -> dict[str, Any]:
    """Medians of the step's timings and of the balance metrics over the measured steps with ``balance``, on the
    running Ray cluster (the workers are killed afterwards)."""
    from single_controller.ray.health import shutdown_worker_group
    from trainer.running.build import build_trainer

    args.overrides = [*args.overrides, f"trainer.balance_batch={str(balance).lower()}"]
    with tempfile.TemporaryDirectory(prefix="colorl-bench-balance-") as local_dir:
        cfg = load_bench_config(args, args.workers, local_dir)
        with stdout_to_stderr():
            trainer = build_trainer(cfg)
            trainer.init_workers()
        try:
            measured = run_steps(trainer, args.warmup, args.steps)
        finally:
            shutdown_worker_group(trainer.fused_wg)
    args.overrides = args.overrides[:-1]
    timing = medians([{k: v for k, v in m.items() if k.startswith("timing_s/")} for m in measured])
    seqlen = medians([{k: v for k, v in m.items() if k.startswith("global_seqlen/")} for m in measured])
    return {
        "s_per_step": round(statistics.median(m["timing_s/step"] for m in measured), 4),
        "timing_s": {k.removeprefix("timing_s/"): v for k, v in timing.items()},
        "global_seqlen": {k.removeprefix("global_seqlen/"): v for k, v in seqlen.items()},
        "response_length_mean": round(statistics.median(m["response_length/mean"] for m in measured), 2),
    }


def main(argv: list[str] | None = None) -> None:
    import ray

    args = parse_args(argv)
    start_ray(args.workers, args.device)  # one cluster for both settings
    try:
        off, on = measure(args, balance=False), measure(args, balance=True)
    finally:
        ray.shutdown()
    emit(
        {
            "benchmark": "balance",
            "workers": args.workers,
            "prompts": args.prompts,
            "n": args.n,
            "response_length": args.response_length,
            "steps": args.steps,
            "warmup": args.warmup,
            "off": off,
            "on": on,
            "speedup": round(off["s_per_step"] / on["s_per_step"], 3),
            "machine": machine(args.device),
        }
    )


if __name__ == "__main__":
    main()
