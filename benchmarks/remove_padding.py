"""Remove-padding and dynamic batch size against the padded path: the actor's log-prob pass and update.

    python -m benchmarks.remove_padding [--rows 64 --prompt-length 32 --response-length 96 --n 1]
                                        [--hidden 256 --layers 4 --micro 16] [--repeats 3 --threads 1]

One process, a random Llama (no checkpoint), a batch of ``--rows`` sequences with left-padded prompts of
random valid length (half to all of ``--prompt-length``) and right-padded responses of 1..``--response-length``
tokens, as a rollout leaves them. Each variant gets the same initial weights and runs
``DataParallelPPOActor.compute_log_prob`` then ``update_policy`` (one mini-batch, AdamW step) ``--repeats``
times; figures are medians. Variants: padded micro-batches of ``--micro`` rows (the baseline), the same
micro-batches packed (remove-padding), and packed micro-batches of at most ``--max-token-len`` valid tokens
(dynamic batch size; by default ``--micro`` × (prompt + response), the padded path's token footprint filled
with real tokens only); also padded + dynamic batch size, and packed micro-batches whose rows that repeat a
prompt share it (``actor.use_prefix_grouper``; with ``--n`` > 1 each prompt is repeated by n rows in a row).

Packed micro-batches are rows holding whole sequences (``packing.pack_batch``), 1-8 padded lengths wide,
whichever costs least (``packing.pack_width``): transformers gives sdpa a dense block-diagonal mask per row, so
a row as wide as all of a micro-batch's tokens would make attention grow with the square of them
(flash-attention's varlen kernel takes one row instead).
``log_prob_max_abs_diff`` is each variant's largest log-prob difference from the padded baseline on valid
tokens (they compute the same thing). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.common import emit, machine, stdout_to_stderr
from config.sections import ActorConfig, OptimConfig
from single_controller.data_proto import DataProto
from workers.compute.actor import DataParallelPPOActor

VARIANTS = {  # name -> (remove_padding, dynamic batch size, shared prompts)
    "padded": (False, False, False),
    "remove_padding": (True, False, False),
    "remove_padding+dynamic_bsz": (True, True, False),
    "padded+dynamic_bsz": (False, True, False),
    "remove_padding+prefix_grouper": (True, False, True),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64, help="sequences in the batch (one mini-batch)")
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--response-length", type=int, default=96)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--n", type=int, default=1, help="rows per prompt (a GRPO group, one after another)")
    parser.add_argument("--micro", type=int, default=16, help="rows per padded micro-batch")
    parser.add_argument(
        "--max-token-len",
        type=int,
        default=None,
        help="dynamic batch size budget (default: micro × (prompt + response) tokens)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def make_batch(args: argparse.Namespace) -> DataProto:
    """A rollout-shaped batch: prompts left-padded, responses right-padded, position ids = cumsum(mask) − 1."""
    g = torch.Generator().manual_seed(args.seed)
    rows, p, r = args.rows, args.prompt_length, args.response_length
    prompt_len = torch.randint(p // 2, p + 1, (rows,), generator=g)
    response_len = torch.randint(1, r + 1, (rows,), generator=g)
    prompt_mask = (torch.arange(p) >= p - prompt_len[:, None]).long()
    response_mask = (torch.arange(r) < response_len[:, None]).long()
    group = torch.arange(rows) // args.n * args.n  # the row whose prompt each row repeats
    prompt_mask = prompt_mask[group]
    attention_mask = torch.cat([prompt_mask, response_mask], -1)
    input_ids = torch.randint(1, args.vocab, (rows, p + r), generator=g)
    input_ids[:, :p] = input_ids[group, :p]
    input_ids = input_ids * attention_mask
    return DataProto.from_dict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp_min(0),
            "responses": input_ids[:, p:],
            "response_mask": response_mask,
            "advantages": torch.randn(rows, r, generator=g) * response_mask,
        }
    )


def llama_config(args: argparse.Namespace) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        max_position_embeddings=args.prompt_length + args.response_length,
        pad_token_id=0,
    )


def build_actor(
    args: argparse.Namespace, state: dict, remove_padding: bool, dynamic: bool, shared: bool = False
) -> DataParallelPPOActor:
    model = LlamaForCausalLM(llama_config(args))
    model.load_state_dict(state)
    actor_config = ActorConfig(
        ppo_mini_batch_size=args.rows,
        ppo_micro_batch_size_per_gpu=args.micro,
        optim=OptimConfig(lr=1e-6),
        use_dynamic_bsz=dynamic,
        ppo_max_token_len_per_gpu=args.max_token_len or args.micro * (args.prompt_length + args.response_length),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    return DataParallelPPOActor(
        model, optimizer, None, actor_config, use_remove_padding=remove_padding, use_prefix_grouper=shared
    )


def run_variant(args: argparse.Namespace, state: dict, data: DataProto, name: str) -> dict:
    """Median seconds of the log-prob pass and the update; the first log-probs against ``old_log_probs``."""
    remove_padding, dynamic, shared = VARIANTS[name]
    actor = build_actor(args, state, remove_padding, dynamic, shared)
    max_token_len = actor.config.ppo_max_token_len_per_gpu if dynamic else None
    log_prob_s, update_s, first = [], [], None
    for _ in range(args.repeats):
        start = time.perf_counter()
        log_probs, _ = actor.compute_log_prob(data, args.micro, max_token_len=max_token_len)
        log_prob_s.append(time.perf_counter() - start)
        first = log_probs if first is None else first
        start = time.perf_counter()
        metrics = actor.update_policy(data)
        update_s.append(time.perf_counter() - start)
    valid = data.batch["response_mask"].bool()
    return {
        "log_prob_s": round(statistics.median(log_prob_s), 4),
        "update_s": round(statistics.median(update_s), 4),
        "update_micro_batches": len(metrics["actor/pg_loss"]),
        "log_prob_max_abs_diff": float((first - data.batch["old_log_probs"])[valid].abs().max()),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data = make_batch(args)
    with stdout_to_stderr():
        state = LlamaForCausalLM(llama_config(args)).state_dict()
        reference = build_actor(args, state, remove_padding=False, dynamic=False)
        data.batch["old_log_probs"], _ = reference.compute_log_prob(data, args.micro)  # the padded baseline's
        variants = {name: run_variant(args, state, data, name) for name in VARIANTS}
    baseline = variants["padded"]
    mask = data.batch["attention_mask"]
    emit(
        {
            "benchmark": "remove_padding",
            "machine": machine("cpu"),
            "config": vars(args),
            "valid_token_fraction": round(float(mask.float().mean()), 4),
            "variants": variants,
            "speedup_vs_padded": {
                name: {
                    "log_prob": round(baseline["log_prob_s"] / v["log_prob_s"], 3),
                    "update": round(baseline["update_s"] / v["update_s"], 3),
                }
                for name, v in variants.items()
            },
        }
    )


if __name__ == "__main__":
    main()
