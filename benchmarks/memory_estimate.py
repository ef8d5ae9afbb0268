"""The memory estimate (``trainer.dry_run``'s, ``trainer/preflight/memory_estimate.py``) against the measured peak
per worker.

    python -m benchmarks.memory_estimate [--config-name demo] [--steps 2] [--set KEY=VALUE ...]

Loads the config as ``main.py`` does (a preset, then the overrides), builds the trainer, runs ``--steps`` training
steps of the real trainer (Ray, colocated workers; no validation, no checkpoint) and reads the workers' peak: the
resident memory on a CPU (``perf/cpu_memory_peak_gb``, the kernel's VmHWM over the worker's life: loading
included), ``perf/max_memory_allocated_gb`` on CUDA. Prints JSON: the estimate per phase at the configured maximum
lengths (the dry run's bound) and at the prompt and response lengths the steps saw (their means: the same model
on the work that ran), the measured peak, and measured / estimate for both.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from typing import Any

from benchmarks.common import emit, machine, stdout_to_stderr
from benchmarks.step import run_steps, start_ray


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-name", default="demo", help="the preset in conf/")
    parser.add_argument("--steps", type=int, default=2, help="training steps (the peak is the largest over them)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override, e.g. --set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
    )
    return parser.parse_args(argv)


def phases_gib(estimate: Any) -> dict[str, dict[str, float]]:
    from trainer.preflight.memory_estimate import GiB

    return {
        p.name: {**{k: round(v / GiB, 3) for k, v in sorted(p.terms.items())}, "total": round(p.total / GiB, 3)}
        for p in estimate.phases
    }


def estimates(cfg: Any, plan: Any, measured: list[dict[str, float]]) -> dict[str, Any]:
    """The estimate at the maximum lengths and at the observed mean lengths (GiB per phase and peak)."""
    from data.builtin import demo_model_config
    from trainer.preflight.dry_run import load_model_sizes
    from trainer.preflight.memory_phases import Lengths, estimate_memory

    models = load_model_sizes(cfg, plan, lambda: demo_model_config(cfg.builtin))
    observed = Lengths(
        round(statistics.fmean(m["prompt_length/mean"] for m in measured)),
        round(statistics.fmean(m["response_length/mean"] for m in measured)),
    )
    out = {}
    for name, lengths in (("at_max_lengths", None), ("at_observed_lengths", observed)):
        estimate = estimate_memory(cfg, plan, models, cfg.trainer.device, lengths)
        out[name] = {
            "peak_gib": round(estimate.peak.total / 2**30, 3),
            "peak_phase": estimate.peak.name,
            "phases": phases_gib(estimate),
        }
    out["observed_lengths"] = {"prompt": observed.prompt, "response": observed.response}
    return out


def main(argv: list[str] | None = None) -> None:
    import ray

    from trainer.running.build import build_trainer
    from verl_compat.cli import load_config

    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="colorl-bench-memory-") as local_dir:
        cfg = load_config(
            [
                *args.overrides,
                "trainer.logger=[]",
                "trainer.val_before_train=false",
                "trainer.resume_mode=disable",
                f"trainer.default_local_dir={local_dir}",
            ],
            config_name=args.config_name,
        )
        with stdout_to_stderr():
            trainer = build_trainer(cfg)
        cfg = trainer.config  # the device resolved, the assets' paths filled in
        start_ray(trainer.plan.n_workers, cfg.trainer.device)
        try:
            with stdout_to_stderr():
                trainer.init_workers()
            measured = run_steps(trainer, 0, args.steps)
        finally:
            ray.shutdown()
    key = "perf/max_memory_allocated_gb" if cfg.trainer.device == "cuda" else "perf/cpu_memory_peak_gb"
    peak = max(m[key] for m in measured)  # VmHWM / the allocator's peak only grow: the last step's is the run's
    result = estimates(cfg, trainer.plan, measured)
    for name in ("at_max_lengths", "at_observed_lengths"):
        result[name]["measured_over_estimate"] = round(peak / result[name]["peak_gib"], 3)
    emit(
        {
            "benchmark": "memory_estimate",
            "config_name": args.config_name,
            "overrides": args.overrides,
            "steps": args.steps,
            "workers": trainer.plan.n_workers,
            "measured_peak_gib_per_worker": round(peak, 3),
            "measured": key,
            **result,
            "machine": machine(cfg.trainer.device),
        }
    )


if __name__ == "__main__":
    main()
