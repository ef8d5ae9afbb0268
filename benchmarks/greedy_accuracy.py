"""Greedy accuracy of a Hugging Face model on a parquet file, with plain ``transformers`` generate (no ColoRL worker).

    python -m benchmarks.greedy_accuracy --model DIR --data test.parquet [--limit 64] [--max-new-tokens 48]
                                         [--batch-size 16] [--threads 1] [--device cpu|cuda] [--show 3]

The baseline an RL run starts from, and a check of an exported checkpoint afterwards. Each prompt goes through
the tokenizer's chat template (as ``RLHFDataset`` renders it), the batch is left-padded, the response is cut at
the first eos and scored by ``data.tasks.default_compute_score`` (the reward the trainer uses). Prints JSON:
``accuracy`` (mean score), the mean of every extra value a dict-valued score gives (the arithmetic problems'
``flexible``), seconds per batch, and the first ``--show`` responses.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.common import default_device, emit, machine
from data.tasks import default_compute_score


def prompt_text(tokenizer: Any, prompt: Any) -> str:
    """A chat prompt through the chat template with the generation prompt; a string prompt as is."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)


def generate(model: Any, tokenizer: Any, texts: list[str], max_new_tokens: int, device: str) -> list[str]:
    """Greedy responses to ``texts`` (one left-padded batch), decoded up to the first eos."""
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    responses = []
    for row in out[:, batch["input_ids"].shape[1] :].tolist():
        if tokenizer.eos_token_id in row:
            row = row[: row.index(tokenizer.eos_token_id)]
        responses.append(tokenizer.decode(row, skip_special_tokens=True))
    return responses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model directory")
    parser.add_argument("--data", required=True, help="a parquet file in verl's layout")
    parser.add_argument("--limit", type=int, default=64, help="the first LIMIT rows")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--show", type=int, default=3, help="responses to include in the output")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(args.device).eval()
    rows = pq.read_table(args.data).to_pylist()[: args.limit]
    scores: list[float] = []
    extras: dict[str, list[float]] = {}
    responses: list[str] = []
    batch_s: list[float] = []
    for start in range(0, len(rows), args.batch_size):
        chunk = rows[start : start + args.batch_size]
        began = time.perf_counter()
        with torch.no_grad():
            responses += generate(
                model, tokenizer, [prompt_text(tokenizer, r["prompt"]) for r in chunk], args.max_new_tokens, args.device
            )
        batch_s.append(time.perf_counter() - began)
        for row, response in zip(chunk, responses[start:]):
            result = default_compute_score(row["data_source"], response, row["reward_model"]["ground_truth"])
            scores.append(float(result["score"]) if isinstance(result, dict) else float(result))
            for key, value in result.items() if isinstance(result, dict) else ():
                if key != "score":
                    extras.setdefault(key, []).append(float(value))
    emit(
        {
            "benchmark": "greedy_accuracy",
            "model": args.model,
            "data": args.data,
            "rows": len(rows),
            "max_new_tokens": args.max_new_tokens,
            "batch_size": args.batch_size,
            "threads": args.threads,
            "accuracy": statistics.fmean(scores),
            **{k: statistics.fmean(v) for k, v in extras.items()},
            "s_per_batch": statistics.median(batch_s),
            "total_s": sum(batch_s),
            "examples": [
                {
                    "prompt": r["prompt"][-1]["content"] if not isinstance(r["prompt"], str) else r["prompt"],
                    "truth": r["reward_model"]["ground_truth"],
                    "response": s,
                }
                for r, s in zip(rows, responses[: args.show])
            ],
            "machine": machine(args.device),
        }
    )


if __name__ == "__main__":
    main()
