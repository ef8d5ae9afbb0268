"""The rollout engines side by side: ``rollout.name=hf`` (ColoRL's decode loop) against ``rollout.name=vllm`` (an
in-process vLLM engine in each worker), on one preset, in one sitting.

    python -m benchmarks.rollout_engines --model-path ~/models/SmolLM2-135M-Instruct --data-dir ~/data/arith
                                         [--config-name smollm2_arith] [--steps 6] [--rounds 2] [--set KEY=VALUE ...]
                                         [--decode false auto true] [--no-vllm]

Each round runs ``main.py --config-name <preset>`` once per contender (never two at once): ``hf:<setting>`` for
each ``--decode`` setting of ``rollout.compile_decode`` (the HF loop, the own step eager, compiled), then
``vllm``, for ``--steps`` training steps without validation or checkpoints, each from its own launch, and reads
the file logger's ``metrics.jsonl``. The first step of each run (warm-up: vLLM's first sync and its kernels' first
calls, the compiled step's first bucket) is left out. Prints JSON: per contender and round the medians of the
generation seconds (``timing_s/gen``: the driver's whole phase, with vLLM the weight sync included), response
tokens/s (non-pad response tokens of the step ÷ ``timing_s/gen``), the step's seconds, the weight sync's seconds
(``timing_s/update_weights``) and its share of the step, and the peak RSS of a worker
(``perf/cpu_memory_peak_gb``, the largest over the run); then each contender's medians over rounds and
``vllm_over`` each ``hf:`` contender (ratios of generation seconds, response tokens/s, step seconds). vLLM's extra
forward for the old log-probs (it runs whenever the rollout's log-probs come from another engine than the actor,
as in verl) is in its step time. Also the first step's ``training/rollout_probs_diff_mean`` under vLLM: the
sampler-learner gap of the setting.
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

from benchmarks.common import emit, machine

REPO = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model-path", help="the preset's model (python -m data.models.smollm2); default: the preset's"
    )
    parser.add_argument(
        "--data-dir", help="train.parquet and test.parquet (data.preprocess.arith); default: the preset's"
    )
    parser.add_argument("--config-name", default="smollm2_arith", help="ColoRL's preset")
    parser.add_argument("--steps", type=int, default=6, help="training steps per run (the first is warm-up)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per engine, alternating")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--decode", nargs="+", default=["auto"], choices=["false", "auto", "true"], help="rollout.compile_decode of hf"
    )
    parser.add_argument("--no-vllm", action="store_true", help="the hf contenders only")
    return parser.parse_args(argv)


def contenders(args: argparse.Namespace) -> list[str]:
    """``hf:<compile_decode>`` per ``--decode`` setting, then ``vllm`` unless ``--no-vllm``."""
    return [f"hf:{setting}" for setting in args.decode] + ([] if args.no_vllm else ["vllm"])


def overrides(args: argparse.Namespace, contender: str, out_dir: str) -> list[str]:
    engine, _, decode = contender.partition(":")
    paths = [f"actor_rollout_ref.rollout.compile_decode={decode}"] if decode else []
    if args.model_path:
        paths.append(f"actor_rollout_ref.model.path={Path(args.model_path).expanduser().resolve()}")
    if args.data_dir:
        data = Path(args.data_dir).expanduser().resolve()
        paths += [f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}"]
    return [
        *paths,
        f"actor_rollout_ref.rollout.name={engine}",
        f"trainer.device={args.device}",
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[file]",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={out_dir}",
        *args.overrides,
    ]


def run(args: argparse.Namespace, contender: str) -> dict[str, Any]:
    """One launch of the preset as ``contender``; its steps' figures (the warm-up step left out of the medians)."""
    with tempfile.TemporaryDirectory(prefix=f"colorl-engines-{contender.replace(':', '-')}-") as out_dir:
        command = [sys.executable, "main.py", f"--config-name={args.config_name}", *overrides(args, contender, out_dir)]
        subprocess.run(command, cwd=REPO, stdout=sys.stderr, stderr=sys.stderr, check=True)
        steps = [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "timing_s/gen" in s]
    return summarize(steps)


def summarize(steps: list[dict[str, float]]) -> dict[str, Any]:
    """Medians over the steps after the first; the peak RSS over all of them."""
    measured = steps[1:] or steps
    median = lambda values: float(f"{statistics.median(values):.4g}")  # noqa: E731
    out = {
        "gen_s": median([s["timing_s/gen"] for s in measured]),
        # timing_per_token_ms/gen: the phase's milliseconds per response token (tool turns included)
        "response_tokens_per_s": median([1000 / s["timing_per_token_ms/gen"] for s in measured]),
        "step_s": median([s["timing_s/step"] for s in measured]),
        "peak_rss_gb_per_worker": round(max(s.get("perf/cpu_memory_peak_gb", 0.0) for s in steps), 3),
        "steps": len(measured),
    }
    if "timing_s/update_weights" in measured[0]:
        out["weight_sync_s"] = median([s["timing_s/update_weights"] for s in measured])
        out["weight_sync_share_of_step"] = median([s["timing_s/update_weights"] / s["timing_s/step"] for s in measured])
    if "training/rollout_probs_diff_mean" in steps[0]:
        out["rollout_probs_diff_mean_first_step"] = steps[0]["training/rollout_probs_diff_mean"]
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    names = contenders(args)
    rounds = [{name: run(args, name) for name in names} for _ in range(args.rounds)]
    medians = {
        name: {
            key: float(f"{statistics.median(r[name][key] for r in rounds):.4g}")
            for key in rounds[0][name]
            if all(key in r[name] for r in rounds)
        }
        for name in names
    }
    vllm = medians.get("vllm")
    emit(
        {
            "benchmark": "rollout_engines",
            "config_name": args.config_name,
            "steps": args.steps,
            "overrides": args.overrides,
            "rounds": rounds,
            "median": medians,
            "vllm_over": {
                name: {key: round(vllm[key] / hf[key], 3) for key in ("gen_s", "response_tokens_per_s", "step_s")}
                for name, hf in medians.items()
                if vllm is not None and name != "vllm"
            },
            "machine": machine(args.device),
        }
    )


if __name__ == "__main__":
    main()
