"""A preset's actor update under each host allocator: peak RSS and seconds per micro-batch.

    python -m benchmarks.allocator [--config-name smollm2_arith] [--micro 4] [--checkpointing]
                                   [--iterations 5] [--allocator mimalloc glibc-kept glibc-returned]

Each allocator runs in its own process, one after the other: the preset's actor (its model, LoRA and loss) does
``--iterations`` forward + backward passes of one micro-batch of ``--micro`` random sequences, as long as the
preset's mean arithmetic problem (73 prompt and 40 response tokens in rows of 96 + 64; remove-padding packs them).
``mimalloc`` is what the trainer preloads into its CPU workers (``workers/runtime/malloc.py``); ``glibc-kept`` its
fallback, glibc with ``keep_freed_memory``; ``glibc-returned`` glibc with a fixed 128 KiB mmap threshold (every block
above it handed back to the kernel on free). Prints JSON per allocator: RSS after the model loads, the peak over the
passes (VmHWM) and the median seconds of the passes after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.common import emit, machine

PROMPT, RESPONSE, PROMPT_WIDTH, RESPONSE_WIDTH = 73, 40, 96, 64


def allocator_env(name: str) -> dict[str, str]:
    from workers.runtime import malloc

    if name == "mimalloc":
        return malloc.worker_env("cpu")
    if name == "glibc-returned":  # setting a malloc tunable fixes glibc's mmap threshold at its 128 KiB default
        return {"MALLOC_TOP_PAD_": str(128 << 10)}
    return {}


def passes(args: argparse.Namespace) -> dict[str, object]:
    """In this process: load the preset's actor and time ``args.iterations`` forward + backward passes."""
    import torch

    from verl_compat.cli import load_with_plan
    from workers.compute.actor import DataParallelPPOActor
    from workers.compute.packing import mini_batch_totals
    from workers.parallel import lora
    from workers.roles.fsdp_workers import load_causal_lm
    from workers.runtime import malloc, perf

    torch.set_num_threads(os.cpu_count() or 1)
    malloc.keep_freed_memory()  # as a CPU worker does: the fallback, a no-op under mimalloc
    cfg, _ = load_with_plan(
        [f"actor_rollout_ref.model.enable_gradient_checkpointing={str(args.checkpointing).lower()}", *args.overrides],
        args.config_name,
    )
    arr = cfg.actor_rollout_ref
    model = lora.add_adapters(load_causal_lm(arr.model), arr.model)
    actor = DataParallelPPOActor(
        model,
        None,
        None,
        arr.actor,
        use_remove_padding=arr.model.use_remove_padding,
        use_fused_kernels=arr.model.use_fused_kernels,
    )
    loaded = perf.memory_metrics(torch.device("cpu"))["perf/cpu_memory_used_gb"]
    rows, width = args.micro, PROMPT_WIDTH + RESPONSE_WIDTH
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(100, model.config.vocab_size, (rows, width), generator=generator)
    mask = torch.zeros(rows, width, dtype=torch.long)
    mask[:, PROMPT_WIDTH - PROMPT : PROMPT_WIDTH + RESPONSE] = 1
    response_mask = mask[:, PROMPT_WIDTH:].clone()
    micro = {
        "input_ids": input_ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, PROMPT_WIDTH:],
        "response_mask": response_mask,
        "advantages": torch.randn(rows, RESPONSE_WIDTH, generator=generator) * response_mask,
        "old_log_probs": -3 * torch.rand(rows, RESPONSE_WIDTH, generator=generator),
    }
    totals = mini_batch_totals(response_mask).global_batch()
    model.train()
    seconds = []
    for _ in range(args.iterations):
        start = time.perf_counter()
        loss, _ = actor._micro_loss(dict(micro), arr.rollout.temperature, totals)
        loss.backward()
        model.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
    peak = perf.memory_metrics(torch.device("cpu"))["perf/cpu_memory_peak_gb"]
    return {
        "mimalloc": malloc.uses_mimalloc(),
        "rss_loaded_gib": round(loaded, 3),
        "peak_rss_gib": round(peak, 3),
        "s_per_pass": round(statistics.median(seconds[1:]), 2),
        "s_all": [round(s, 2) for s in seconds],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-name", default="smollm2_arith")
    parser.add_argument("--micro", type=int, default=4, help="sequences per forward + backward")
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing on")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument(
        "--allocator",
        nargs="+",
        default=["mimalloc", "glibc-kept", "glibc-returned"],
        choices=["mimalloc", "glibc-kept", "glibc-returned"],
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(passes(args)))
        return
    results = {}
    for name in args.allocator:
        command = [
            sys.executable,
            "-m",
            "benchmarks.allocator",
            *(argv if argv is not None else sys.argv[1:]),
            "--child",
        ]
        env = {**{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}, **allocator_env(name)}
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
        results[name] = json.loads(out.strip().splitlines()[-1])
    emit(
        {
            "benchmark": "allocator",
            "config_name": args.config_name,
            "micro": args.micro,
            "checkpointing": args.checkpointing,
            "results": results,
            "machine": machine("cpu"),
        }
    )


if __name__ == "__main__":
    main()
