"""The rollout's decode step alone: the HF loop (``rollout.compile_decode=false``) against the compiled, bucketed
step (``workers.compute.decode``), on one model, one precision at a time, in one process.

    python -m benchmarks.decode_step --model-path ~/models/SmolLM2-135M-Instruct [--rows 32 --prompt-length 96
        --response-length 64] [--dtype bf16 fp32] [--threads N] [--repeats 3] [--profile] [--all-buckets]

Every row decodes ``--response-length`` tokens (no EOS: the batch stays at ``--rows``, one bucket), greedy. A decode
step's time is (generation − prefill) / (response length − 1): the prefill is timed on its own
(``decode_loop.prefill``), sampling and the cache writes are in the step, as in the rollout. The best of
``--repeats`` generations after a warm-up one (which, compiled, also compiles the bucket: ``compile_s`` is its time
over a warm one's).

Prints JSON per dtype: ``step_ms`` (hf, eager own step, compiled), the step's FLOPs (2 · matmul parameters · rows,
attention's 4 · layers · heads · head dim · context · rows at the mean context), ``fraction_of_matmul`` (FLOP/s of the
step over the machine's measured 1024³ matmul rate in that dtype, ``perf.measured_matmul_flops``; also the rate of a
matmul of the step's own shapes: rows × hidden against the LM head); ``--all-buckets``: the seconds to compile
every bucket of ``--rows`` (a fresh process's first rollout when rows end at different lengths); ``roofline``: what
bounds the step from below, the bytes it reads (the matmul weights, the KV cache) over the machine's streaming rate,
and its matmuls and attention timed alone from memory (:func:`roofline`), with the fraction of the matmul rate each
would allow; ``--profile``: the compiled and eager steps' top operators (8 steps after a prefill) by self CPU
time (torch.profiler).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch

from benchmarks.common import emit, machine
from workers.compute import decode, decode_loop, rollout
from workers.runtime import perf

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", required=True, help="an HF Llama-family model dir")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt-length", type=int, default=96)
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["bf16", "fp32"])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="top operators of each step (torch.profiler)")
    parser.add_argument("--all-buckets", action="store_true", help="time compiling every bucket of --rows")
    return parser.parse_args(argv)


def prompts(rows: int, length: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompts of random ids, lengths from half to all of ``length`` (distinct rows)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, length), generator=g)
    lengths = torch.randint(length // 2, length + 1, (rows,), generator=g)
    mask = (torch.arange(length) >= (length - lengths)[:, None]).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids * mask, mask, positions


def timed(fn: Any, repeats: int) -> tuple[float, float]:
    """(the first call's seconds, the best of ``repeats`` more)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return first, best


def step_flops(model: torch.nn.Module, rows: int, context: float) -> float:
    """FLOPs of one decode step: 2 · (linear and LM-head parameters) per row, and attention's q·Kᵀ and p·V."""
    spec, (_, _, _, head, layers) = decode.read_weights(model)
    matmul = head.numel() + sum(w.numel() for layer in layers for w in layer if w is not None and w.dim() == 2)
    attention = 4 * len(layers) * spec.heads * spec.head_dim * context
    return rows * (2 * matmul + attention)


def best_of(fn: Any, repeats: int = 5) -> float:
    """The fastest of ``repeats`` calls of ``fn`` after one warm-up, in seconds."""
    return timed(fn, repeats)[1]


STREAMED = 1 << 29  # bytes the streaming rate is measured over at least: more than a CPU's last-level cache


def roofline(model: torch.nn.Module, rows: int, cache_length: int) -> dict[str, float]:
    """What bounds a decode step from below: the bytes it reads (every matmul weight once, and each layer's
    keys and values over the whole cache) against the rate this machine streams memory, and the step's matmuls
    and attention timed alone on the model's own weights, in the step's order (so they come from memory, not
    from a warm cache, as in the step)."""
    spec, (_, _, _, head, layers) = decode.read_weights(model)
    linears = [w for layer in layers for w in layer if w is not None and w.dim() == 2] + [head]
    dtype, size = head.dtype, head.element_size()
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1]).to(dtype) for w in linears}
    shape = (rows, spec.kv_heads, cache_length, spec.head_dim)
    caches = [(torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)) for _ in layers]
    q = torch.randn(rows, spec.kv_heads, spec.heads // spec.kv_heads, spec.head_dim).to(dtype)
    probs = torch.randn(rows, spec.kv_heads, spec.heads // spec.kv_heads, cache_length).to(dtype)
    weight_bytes = sum(w.numel() for w in linears) * size
    cache_bytes = sum(k.numel() + v.numel() for k, v in caches) * size
    big = torch.ones(max(2 * (weight_bytes + cache_bytes), STREAMED) // size, dtype=dtype)  # beyond any cache level
    stream = big.numel() * size / best_of(big.sum)
    linears_s = best_of(lambda: [torch.nn.functional.linear(inputs[w.shape[1]], w) for w in linears])
    attention_s = best_of(lambda: [(q @ k.transpose(-1, -2), probs @ v) for k, v in caches])
    return {
        "weight_bytes": weight_bytes,
        "cache_bytes": cache_bytes,
        "stream_gb_s": round(stream / 1e9, 1),
        "bytes_over_stream_ms": round((weight_bytes + cache_bytes) / stream * 1e3, 2),
        "linears_alone_ms": round(linears_s * 1e3, 2),
        "linears_gb_s": round(weight_bytes / linears_s / 1e9, 1),
        "attention_alone_ms": round(attention_s * 1e3, 2),
        "attention_gb_s": round(cache_bytes / attention_s / 1e9, 1),
    }


def top_ops(fn: Any, rows: int = 8) -> list[list[Any]]:
    """[operator, self CPU ms per call of ``fn``, share] of the ``rows`` largest, over 3 calls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [
        [e.key, round(e.self_cpu_time_total / 3e3, 2), round(e.self_cpu_time_total / total, 3)] for e in events[:rows]
    ]


PROFILED = ("compiled", "eager")


def steps(model: torch.nn.Module, batch: tuple, args: argparse.Namespace, compiled: bool) -> Any:
    """A function that runs 8 decode steps (at most ``--response-length``; :func:`decode.decode_step`, compiled
    or not) after one prefill."""
    cache, logits = decode_loop.prefill(model, *batch, args.prompt_length + args.response_length)
    spec, weights = decode.read_weights(model)
    keys, values = [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]
    mask = torch.cat([batch[1].bool(), torch.ones(args.rows, args.response_length, dtype=torch.bool)], -1)
    token, position = logits.argmax(-1), batch[2][:, -1]
    step = decode.compiled_step(torch.device("cpu")) if compiled else decode.decode_step
    columns = torch.arange(args.prompt_length, args.prompt_length + args.response_length)

    def run() -> None:
        for t in range(min(8, args.response_length)):
            step(token, position + 1 + t, columns[t], mask, weights, keys, values, spec)

    return run


def measure(args: argparse.Namespace, dtype: torch.dtype) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=dtype).eval()
    batch = prompts(args.rows, args.prompt_length, model.config.vocab_size)
    length, r = args.prompt_length + args.response_length, args.response_length
    common = dict(response_length=r, eos_token_id=None, pad_token_id=0, do_sample=False)
    with torch.no_grad():
        runs = {
            "prefill": lambda: decode_loop.prefill(model, *batch, length),
            "hf": lambda: rollout.generate_sequences(model, *batch, **common, compile_decode=False),
            "eager": lambda: decode.generate(model, *batch, **common, compiled=False),
            "compiled": lambda: decode.generate(model, *batch, **common, compiled=True),
        }
        times = {name: timed(fn, args.repeats) for name, fn in runs.items()}
        prefill = times["prefill"][1]
        step_s = {k: (times[k][1] - prefill) / (r - 1) for k in ("hf", "eager", "compiled")}
        flops = step_flops(model, args.rows, batch[1].sum(-1).float().mean().item() + r / 2)
        matmul = perf.measured_matmul_flops(torch.device("cpu"), dtype)
        x = torch.randn(args.rows, model.config.hidden_size).to(dtype)
        head = model.get_output_embeddings().weight
        _, head_s = timed(lambda: x @ head.T, 20)
        out: dict[str, Any] = {
            "dtype": str(dtype).removeprefix("torch."),
            "prefill_s": round(prefill, 4),
            "step_ms": {k: round(v * 1e3, 2) for k, v in step_s.items()},
            "compiled_over_hf": round(step_s["hf"] / step_s["compiled"], 3),
            "step_gflop": round(flops / 1e9, 3),
            "matmul_tflops_1024": round(matmul / 1e12, 4),
            "matmul_tflops_head_shape": round(2 * x.shape[0] * head.numel() / head_s / 1e12, 4),
            "fraction_of_matmul": {k: round(flops / v / matmul, 3) for k, v in step_s.items()},
            "compile_s": round(times["compiled"][0] - times["compiled"][1], 2),
            "generation_s": {k: round(times[k][1], 3) for k in ("hf", "compiled")},
        }
        bound = out["roofline"] = roofline(model, args.rows, length)
        kernels_s = (bound["linears_alone_ms"] + bound["attention_alone_ms"]) / 1e3
        bound["fraction_of_matmul_at_stream_rate"] = round(flops / (bound["bytes_over_stream_ms"] / 1e3) / matmul, 3)
        bound["fraction_of_matmul_at_kernels_alone"] = round(flops / kernels_s / matmul, 3)
        if args.all_buckets:
            start = time.perf_counter()
            for size in decode.buckets(args.rows)[:-1]:  # the largest compiled above
                decode.generate(model, *(t[:size] for t in batch), **{**common, "response_length": 2})
            out["compile_other_buckets_s"] = round(time.perf_counter() - start, 2)
        if args.profile:
            out["profile"] = {k: top_ops(steps(model, batch, args, compiled=k == "compiled")) for k in PROFILED}
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.profile:  # inductor's kernels as profiler events
        torch._inductor.config.cpp.enable_kernel_profile = True
    results = [measure(args, DTYPES[name]) for name in args.dtype]
    emit(
        {
            "benchmark": "decode_step",
            "model_path": args.model_path,
            "rows": args.rows,
            "prompt_length": args.prompt_length,
            "response_length": args.response_length,
            "threads": torch.get_num_threads(),
            "results": results,
            "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR", "default"),
            "machine": machine("cpu"),
        }
    )


if __name__ == "__main__":
    main()
