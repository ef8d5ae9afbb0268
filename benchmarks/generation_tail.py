"""What verl's partial rollouts could save here: the cost of a generation's long tail on this device.

    python -m benchmarks.generation_tail --model DIR --data train.parquet [--prompts 8] [--n 4]
                                         [--response-length 64] [--temperature 0.5] [--batches 4] [--threads 1]

``colocate_async`` (verl's, and ColoRL's ``trainer.asynchronous.partial``) stops a step's generation once enough prompt
groups are complete and resumes the unfinished responses, under the new weights, beside the next batch's. In the steady
state every decode step then runs a full batch of live rows. The gain is the long tail's: the decode steps a
whole-batch generation (``sync``) runs with few rows live.

This runs ColoRL's decode loop (``workers.compute.rollout.generate_sequences``, as a rollout worker runs it: the
preset's prompts, ``n`` samples each, sampled) and times every forward with the number of rows it decodes. It fits
a decode step's time as ``fixed + per_row × rows`` and prints, as JSON:

- ``decode_s``: the decode steps' time; ``prefill_s``;
- ``fixed_share``: the fixed part of a full-batch step (weights read, launches). On a GPU it is close to 1, so a
  step with 4 rows costs what one with 64 costs, and the tail is what partial rollouts win back;
- ``steady_decode_s``: the live rows' decode steps (``response_mask``) at the full batch's cost per row: the
  decode time with partial rollouts in the steady state;
- ``bound``: ``1 - steady / actual`` of the generation (prefill included): the most partial rollouts can save;
- ``bound_if_fixed``: the same where a decode step costs as much at any number of rows (``fixed_share`` = 1, a GPU's
  memory-bound decode of a small model), prefill left out: ``1 - live rows / (rows × decode steps)``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.common import default_device, emit, machine
from benchmarks.greedy_accuracy import prompt_text
from workers.compute.rollout import generate_sequences
from workers.tools.turns import eos_token_ids


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model directory")
    parser.add_argument("--data", required=True, help="a parquet file in verl's layout (the train split)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per batch (the preset's train_batch_size)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (rollout.n)")
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU): one worker's")
    parser.add_argument("--device", default=default_device())
    return parser.parse_args(argv)


def timed_forwards(model: torch.nn.Module, log: list[tuple[int, float]]) -> list:
    """Append (rows, seconds) of every forward of ``model`` to ``log`` (synchronized on a GPU); the hooks' handles."""
    started: list[float] = []

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def before(module, args, kwargs):
        sync()
        started.append(time.perf_counter())

    def after(module, args, kwargs, output):
        sync()
        log.append((kwargs["input_ids"].shape[0], time.perf_counter() - started.pop()))

    return [
        model.register_forward_pre_hook(before, with_kwargs=True),
        model.register_forward_hook(after, with_kwargs=True),
    ]


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``seconds = fixed + per_row × rows`` over (rows, seconds); all per row when every step
    decoded as many rows (no row left early: nothing tells the two apart)."""
    if len({rows for rows, _ in points}) == 1:
        return 0.0, statistics.fmean(s for _, s in points) / points[0][0]
    slope, intercept = statistics.linear_regression([float(r) for r, _ in points], [s for _, s in points])
    return max(intercept, 0.0), slope


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(args.device).eval()
    rows = pq.read_table(args.data).to_pylist()[: args.prompts * args.batches]
    decode: list[tuple[int, float]] = []
    prefill_s = live_steps = 0.0
    for start in range(0, len(rows), args.prompts):
        texts = [prompt_text(tokenizer, r["prompt"]) for r in rows[start : start + args.prompts]]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        ids, mask = (enc[k].repeat_interleave(args.n, dim=0) for k in ("input_ids", "attention_mask"))
        log: list[tuple[int, float]] = []
        handles = timed_forwards(model, log)
        out = generate_sequences(
            model, ids, mask, (mask.cumsum(-1) - 1).clamp(min=0),
            response_length=args.response_length, eos_token_id=eos_token_ids(model.generation_config, tokenizer),
            pad_token_id=tokenizer.pad_token_id, temperature=args.temperature,
        )  # fmt: skip
        for handle in handles:
            handle.remove()
        prefill_s += log[0][1]
        decode += log[1:]
        live_steps += float(out["response_mask"].sum()) - len(ids)  # each row's first token is the prefill's
    full = args.prompts * args.n
    fixed, per_row = fit(decode)
    decode_s = sum(s for _, s in decode)
    steady = live_steps * (fixed + per_row * full) / full
    emit(
        {
            "benchmark": "generation_tail",
            "model": args.model,
            "batches": args.batches,
            "rows": full,
            "response_length": args.response_length,
            "threads": args.threads,
            "prefill_s": round(prefill_s, 3),
            "decode_s": round(decode_s, 3),
            "decode_steps": len(decode),
            "mean_rows_decoded": round(statistics.fmean(r for r, _ in decode), 2),
            "live_fraction": round(live_steps / sum(r for r, _ in decode), 3),
            "fixed_s": round(fixed, 5),
            "per_row_s": round(per_row, 6),
            "fixed_share": round(fixed / (fixed + per_row * full), 3),
            "steady_decode_s": round(steady, 3),
            "bound": round(1 - (prefill_s + steady) / (prefill_s + decode_s), 3),
            "bound_if_fixed": round(1 - live_steps / (full * len(decode)), 3),
            "machine": machine(args.device),
        }
    )


if __name__ == "__main__":
    main()
