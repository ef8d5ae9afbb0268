"""The compute floor of one PPO / GRPO step: the same work in one plain process, without Ray or FSDP.

    python -m benchmarks.floor [--algo grpo|ppo] [--hidden 128 --layers 2] [--prompts 16 --n 8]
                               [--response-length 8] [--threads N] [--steps 20 --warmup 3] [--device cpu|cuda]

Same model (the same HF dir as ``benchmarks.step``), same batches (the trainer's dataloader, repeated n times), same
code: ``workers.compute.rollout.generate_sequences`` on the plain module (LoRA under ``lora.merged_adapters``), the
actor's ``compute_log_prob`` (old; ref with ``--kl``; with ``rollout.calculate_log_probs`` the rollout's log-probs are
the update's old ones, as in the trainer, and the forward is timed only for ``gen_fwd_train``), the critic's
``compute_values`` (ppo), and the actor's (and critic's) ``update_*``: forward + backward + grad clip + AdamW, one
optimizer step over the whole batch. Rewards and advantages: the trainer's reward function, ``algos.compute_advantage``.
With ``actor_rollout_ref.model.lora_rank`` > 0 (``--set``) the policy has the workers' adapters (``lora.add_adapters``),
AdamW steps only them, and the reference is the policy, adapters disabled (``lora.as_reference``), as in the trainer.

Prints JSON: the median of each phase (reward and adv too, though the floors leave them out), and the per-step sums
gen+train (no extra forwards), gen+fwd+train (with old/ref log-prob and value forwards) and ``floor_s``: gen + train +
the forwards the trainer runs in this configuration (``floor_phases``: ref with a KL, values with a critic, old
log-probs unless the update is one on-policy step) — the floor that applies; ``perf``: its MFU (``mfu/floor``, counted
as ``benchmarks.step`` counts a step; ``mfu/actor``, the update's); ``response_tokens_per_s_floor``: the non-pad
response tokens sampled / ``floor_s``; ``peak_rss_gb``: this process's peak resident memory from the model load on
(after the dataloader and any built-in assets); on CUDA ``cuda_max_allocated_gb``, ``torch.cuda.max_memory_allocated``;
with ``--phase-memory``, ``memory_gb``: the actor's weights and optimizer state, its KV cache at this shape and each
phase's peak RSS (``memory_breakdown``). ``--vocab-size`` (with
``--model-path``) swaps in the same architecture with another vocabulary and random weights.
Precision: each role's ``fsdp_config.mixed_precision``, as in the workers (bf16 on CUDA by default, fp32 on CPU); in
bf16 the models compute in bf16 and AdamW steps fp32 master weights (``MasterWeights``, as one worker rank does).

Threads: the default (all cores in one process) matches the trainer's workers × threads. On a machine that other busy
processes share, OpenMP threads spin while they wait on a descheduled sibling and a 2-thread run can be 10-20x slower
than a 1-thread one: compare figures taken at low load (``machine.loadavg``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
from typing import Any

import numpy as np
import torch

from benchmarks.common import (
    add_batch_args,
    add_model_args,
    cycle,
    emit,
    load_bench_config,
    machine,
    medians,
    stdout_to_stderr,
    vocabulary_variant,
)
from benchmarks.floor_models import Floor
from benchmarks.memory import PhasePeaks, reset_peak_rss, storage_bytes
from planner.phases import uses_full_kl
from single_controller.data_proto import DataProto
from workers.parallel import fsdp
from workers.runtime import malloc, perf

FORWARD_PHASES = ("old_log_prob", "ref", "values")
TRAIN_PHASES = ("update_actor", "update_critic")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    add_batch_args(parser)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (CPU)")
    parser.add_argument(
        "--phase-memory",
        action="store_true",
        help="sample the RSS every ms: the peak of each phase, and what the tensors hold (memory_gb)",
    )
    return parser.parse_args(argv)


def memory_breakdown(floor: Floor, sequences: int, sequence_length: int) -> dict[str, Any]:
    """GB held by the actor's weights (compute copy and fp32 masters) and optimizer state, its KV cache at this
    batch shape (2 · layers · kv heads · head dim · tokens, in the compute dtype), and each phase's peak RSS."""
    module, optimizer = floor.actor.module, floor.actor.optimizer
    params = [*module.parameters(), *(p for group in optimizer.param_groups for p in group["params"])]
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    config = module.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    kv_cache = 2 * config.num_hidden_layers * kv_heads * head_dim * sequences * sequence_length * floor.dtype.itemsize
    gb = lambda nbytes: round(nbytes / perf.GiB, 3)  # noqa: E731
    return {
        "weights": gb(storage_bytes(params)),
        "optimizer": gb(storage_bytes(state)),
        "kv_cache": gb(kv_cache),
        "peak_rss_by_phase": {
            k: round(v / 1024, 3) for k, v in floor.phases.peaks.items() if k not in ("setup", "between")
        },
    }


def summarize(rows: list[dict[str, float]], forwards: list[str]) -> dict[str, Any]:
    """Phase medians and per-step floors' medians: gen+train, gen+fwd+train, gen + train + ``forwards`` (trainer's)."""
    gen_train = [r["gen"] + sum(r.get(p, 0.0) for p in TRAIN_PHASES) for r in rows]
    gen_fwd_train = [g + sum(r.get(p, 0.0) for p in FORWARD_PHASES) for g, r in zip(gen_train, rows)]
    applicable = [g + sum(r[p] for p in forwards) for g, r in zip(gen_train, rows)]
    tokens = [r["response_tokens"] for r in rows]
    phases = medians([{k: v for k, v in r.items() if k not in ("response_tokens", "tokens")} for r in rows])

    def rate(seconds: list[float]) -> float:
        return round(statistics.median(t / s for t, s in zip(tokens, seconds)), 1)

    return {
        "timing_s": phases,
        "gen_plus_train_s": round(statistics.median(gen_train), 4),
        "gen_fwd_train_s": round(statistics.median(gen_fwd_train), 4),
        "response_tokens_per_s_gen_train": rate(gen_train),
        "response_tokens_per_s_gen_fwd_train": rate(gen_fwd_train),
        "floor_phases": ["gen", *forwards, *(p for p in TRAIN_PHASES if p in phases)],
        "floor_s": round(statistics.median(applicable), 4),
        "response_tokens_per_s_floor": rate(applicable),
    }


def floor_mfu(
    cfg: Any, rows: list[dict[str, float]], forwards: list[str], sequences: int, device: torch.device
) -> dict[str, float]:
    """MFU of the floor (gen + ``forwards`` + train, as ``benchmarks.step`` counts a step) and of the actor update."""
    from benchmarks.step import actor_flops_model, step_flops

    actor = cfg.actor_rollout_ref.actor
    peak, _ = perf.peak_flops(device, fsdp.compute_dtype(device, actor.fsdp_config.mixed_precision))
    floor, update = [], []
    for r in rows:
        lengths = {
            "prompt_length/mean": (r["tokens"] - r["response_tokens"]) / sequences,
            "response_length/mean": r["response_tokens"] / sequences,
        }
        ran = {f"timing_s/{p}": r[p] for p in ("gen", *forwards, *TRAIN_PHASES) if p in r}
        seconds = sum(ran.values())
        floor.append(step_flops(cfg, {**lengths, **ran}, sequences) / (seconds * peak))
        seq_lens = torch.full((sequences,), r["tokens"] / sequences)
        actor_flops = actor_flops_model(cfg).update_flops(
            seq_lens, actor.ppo_epochs, reference_forward=uses_full_kl(actor)
        )
        update.append(actor_flops / (r["update_actor"] * peak))
    return {
        "peak_tflops": round(peak / 1e12, 5),
        "mfu/floor": round(statistics.median(floor), 5),
        "mfu/actor": round(statistics.median(update), 5),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "cpu":
        malloc.rerun_with_worker_allocator(args.device)  # as the trainer's CPU workers allocate
        torch.set_num_threads(args.threads)
        malloc.keep_freed_memory()  # the workers' fallback where mimalloc is not installed
    torch.manual_seed(args.seed)
    with vocabulary_variant(args), tempfile.TemporaryDirectory(prefix="colorl-bench-floor-") as local_dir:
        cfg, floor, rows, forwards = run_floor(args, local_dir)
        sequences = args.prompts * args.n
        mfu = floor_mfu(cfg, rows, forwards, sequences, floor.device)  # reads the model's config
    emit(
        {
            "benchmark": "floor",
            "algo": args.algo,
            "kl": args.kl,
            "hidden": args.hidden,
            "layers": args.layers,
            "n_params": floor.n_params,
            "trainable_params": floor.trainable_params,
            "lora_rank": cfg.actor_rollout_ref.model.lora_rank,
            "model_path": cfg.actor_rollout_ref.model.path,
            "vocab_size": floor.actor.module.config.vocab_size,
            "prompts": args.prompts,
            "n": args.n,
            "prompt_length": args.prompt_length,
            "response_length": args.response_length,
            "steps": args.steps,
            "warmup": args.warmup,
            "threads": torch.get_num_threads() if args.device == "cpu" else None,
            **summarize(rows, forwards),
            "perf": mfu,
            "response_length_mean": round(statistics.median(r["response_tokens"] for r in rows) / sequences, 3),
            "peak_rss_gb": round(perf.peak_rss_bytes() / perf.GiB, 3),
            **(
                {"cuda_max_allocated_gb": round(torch.cuda.max_memory_allocated() / perf.GiB, 3)}
                if args.device == "cuda"
                else {}
            ),
            **(
                {"memory_gb": memory_breakdown(floor, sequences, args.prompt_length + args.response_length)}
                if args.phase_memory
                else {}
            ),
            "machine": machine(args.device),
        }
    )


def run_floor(args: argparse.Namespace, local_dir: str) -> tuple[Any, Floor, list[dict[str, float]], list[str]]:
    """(the config, the floor, each measured step's phase times, the forward phases the trainer runs)."""
    from trainer.running.build import build_trainer

    cfg = load_bench_config(args, 1, local_dir)
    with stdout_to_stderr():
        trainer = build_trainer(cfg)  # builds/loads the assets and the dataloader; starts no workers
    with contextlib.suppress(OSError):  # Linux: the peak RSS counts from here, as a worker's has no asset build
        reset_peak_rss()
    cfg, plan = trainer.config, trainer.plan  # with the assets' paths filled in
    floor = Floor(cfg, torch.device(args.device), trainer.reward_fn, old_from_rollout=plan.old_log_prob_from_rollout)
    floor.phases = PhasePeaks() if args.phase_memory else None
    runs = {"old_log_prob": plan.recompute_old_log_prob, "ref": plan.compute_ref_log_prob, "values": plan.use_critic}
    forwards = [phase for phase in FORWARD_PHASES if runs[phase]]
    batches = cycle(trainer.train_dataloader)
    rows = []
    for i in range(args.warmup + args.steps):
        batch = DataProto.from_single_dict(next(batches))
        batch.non_tensor_batch["uid"] = np.array([f"{i}-{j}" for j in range(len(batch))], dtype=object)
        timing = floor.step(batch.repeat(args.n, interleave=True))
        if i >= args.warmup:
            rows.append(timing)
    return cfg, floor, rows, forwards


if __name__ == "__main__":
    main()
