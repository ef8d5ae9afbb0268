"""Pieces shared by the benchmark scripts: one set of flags, the config they map to, and JSON output.

Every benchmark describes the same work with the same flags (model size, prompts per step, group size ``n``,
prompt and response lengths, workers, device), so the figures of ``step``, ``floor`` and ``trl`` line up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import queue
import socket
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The model: the built-in tiny Llama of a given size (built once into ``--cache-dir``) or an HF dir."""
    group = parser.add_argument_group("model")
    group.add_argument("--hidden", type=int, default=128, help="hidden size of the built-in Llama")
    group.add_argument("--layers", type=int, default=2, help="layers of the built-in Llama")
    group.add_argument(
        "--sft-warmup-steps",
        type=int,
        default=20,
        help="supervised warm-up of the built-in model (realistic response lengths; 0 = random)",
    )
    group.add_argument("--task", default="reverse", help="built-in task")
    group.add_argument("--cache-dir", default=".cache/colorl", help="where the built-in assets are cached")
    group.add_argument("--model-path", default=None, help="an HF model dir instead of the built-in model")
    group.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="with --model-path: the same architecture with this vocabulary, random weights "
        "(memory against vocabulary; its tokenizer is the model's)",
    )


def add_batch_args(parser: argparse.ArgumentParser, steps: int = 20, warmup: int = 3) -> None:
    """The step's work: algorithm, batch shape, measured and warm-up steps, device."""
    group = parser.add_argument_group("work per step")
    group.add_argument("--algo", choices=["grpo", "ppo"], default="grpo", help="ppo = GAE with a critic")
    group.add_argument("--kl", action="store_true", help="KL loss against a reference model (adds the ref forward)")
    group.add_argument("--prompts", type=int, default=16, help="prompts per step")
    group.add_argument("--n", type=int, default=8, help="responses per prompt")
    group.add_argument("--prompt-length", type=int, default=8, help="prompts are left-padded to this many tokens")
    group.add_argument("--response-length", type=int, default=8, help="max new tokens per response")
    group.add_argument("--steps", type=int, default=steps, help="measured steps")
    group.add_argument("--warmup", type=int, default=warmup, help="unmeasured steps first")
    group.add_argument("--device", choices=["cpu", "cuda"], default=default_device())
    group.add_argument("--seed", type=int, default=1)
    group.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other ColoRL config override, e.g. --set actor_rollout_ref.model.use_remove_padding=true",
    )


def config_overrides(args: argparse.Namespace, workers: int) -> list[str]:
    """ColoRL config overrides for the flags: one optimizer step per training step, one micro-batch per worker.

    The mini-batch is the whole batch (one optimisation pass, as TRL's ``num_iterations=1``), and micro-batches
    are each worker's whole share, so the figures are not a function of micro-batching.
    """
    per_worker = args.prompts * args.n // max(workers, 1)
    overrides = [
        f"builtin.cache_dir={os.path.abspath(args.cache_dir)}",
        f"builtin.task={args.task}",
        f"builtin.hidden_size={args.hidden}",
        f"builtin.num_layers={args.layers}",
        f"builtin.sft_warmup_steps={args.sft_warmup_steps}",
        f"data.train_batch_size={args.prompts}",
        f"data.max_prompt_length={args.prompt_length}",
        f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={per_worker}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={per_worker}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={per_worker}",
        f"actor_rollout_ref.actor.use_kl_loss={str(args.kl).lower()}",
        f"critic.ppo_micro_batch_size_per_gpu={per_worker}",
        f"critic.forward_micro_batch_size_per_gpu={per_worker}",
        f"algorithm.adv_estimator={'gae' if args.algo == 'ppo' else 'grpo'}",
        f"trainer.device={args.device}",
        f"trainer.n_gpus_per_node={workers}",
        f"trainer.seed={args.seed}",
        "trainer.logger=[]",
        "trainer.val_before_train=false",
        "trainer.resume_mode=disable",
    ]
    if args.model_path:
        overrides.append(f"actor_rollout_ref.model.path={os.path.abspath(args.model_path)}")
    return overrides + list(args.overrides)


@contextlib.contextmanager
def vocabulary_variant(args: argparse.Namespace) -> Iterator[None]:
    """With ``--vocab-size``: ``args.model_path`` points, for the block, at a copy of its architecture with that
    vocabulary and random weights (bf16 on disk), beside the model's tokenizer; otherwise nothing changes."""
    if args.vocab_size is None:
        yield
        return
    if not args.model_path:
        raise SystemExit("--vocab-size needs --model-path (the architecture to copy)")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = args.model_path
    with tempfile.TemporaryDirectory(prefix="colorl-vocab-") as variant:
        config = AutoConfig.from_pretrained(source)
        config.vocab_size = args.vocab_size
        torch.manual_seed(args.seed)
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(variant)
        AutoTokenizer.from_pretrained(source).save_pretrained(variant)
        args.model_path = variant
        try:
            yield
        finally:
            args.model_path = source


def load_bench_config(args: argparse.Namespace, workers: int, local_dir: str) -> Any:
    """The composed, validated ColoRL config for the flags (outputs, if any, go under ``local_dir``)."""
    from verl_compat.cli import load_config

    # the demo's recipe around the benchmark's shapes, also with --model-path (which would pick verl's defaults)
    return load_config([*config_overrides(args, workers), f"trainer.default_local_dir={local_dir}"], config_name="demo")


def cycle(loader: Iterable) -> Iterator:
    """Batches from ``loader``, epoch after epoch."""
    while True:
        yield from loader


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Progress prints (asset building, warnings) go to stderr, so stdout holds only the JSON result."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def medians(rows: list[dict[str, float]], ndigits: int = 4) -> dict[str, float]:
    """Per-key median over the rows that have the key."""
    keys = sorted({k for row in rows for k in row})
    return {k: round(statistics.median(row[k] for row in rows if k in row), ndigits) for k in keys}


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (other processes slow the timings down)."""
    return [float(x) for x in open("/proc/loadavg").read().split()[:3]] if os.path.exists("/proc/loadavg") else []


def machine(device: str) -> dict[str, Any]:
    """What the figures were measured on."""
    info: dict[str, Any] = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "device": device,
        "loadavg": load_average(),
    }
    if device == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def emit(result: dict[str, Any]) -> None:
    """Print the result as one JSON line on stdout."""
    print(json.dumps(result), flush=True)


def run_ranks(rank_main: Callable[..., None], world: int, args: dict[str, Any]) -> list[dict[str, Any]]:
    """Run ``rank_main(rank, world, args, results)`` in ``world`` fresh spawned processes (``args`` gets a free
    ``port`` for their process group); the dicts they put on ``results``, by ``"rank"``. A rank that dies fails it."""
    import torch.multiprocessing as mp  # deferred: the other helpers here need no torch

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        args = {**args, "port": sock.getsockname()[1]}
    procs = [ctx.Process(target=rank_main, args=(rank, world, args, results)) for rank in range(world)]
    for p in procs:
        p.start()
    rows: list[dict[str, Any]] = []
    try:
        while len(rows) < world:
            try:
                rows.append(results.get(timeout=5))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError(f"a rank of the world-{world} run failed (its traceback is above)") from None
    finally:
        for p in procs:
            p.join(timeout=60)
    return sorted(rows, key=lambda r: r["rank"])
