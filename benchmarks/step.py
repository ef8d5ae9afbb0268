"""PPO / GRPO step throughput of the real trainer: Ray driver, colocated FSDP workers, every phase timed.

    python -m benchmarks.step [--algo grpo|ppo] [--hidden 128 --layers 2] [--prompts 16 --n 8]
                              [--response-length 8] [--workers 2] [--steps 20 --warmup 3] [--device cpu|cuda]

Builds the trainer exactly as ``main.py`` does (``trainer.running.build.build_trainer``), starts Ray, then calls
``trainer.train_step`` on training batches: ``--warmup`` unmeasured steps, then ``--steps`` measured ones.
Prints JSON: medians of ``timing_s/step`` and of every phase (``timing_s/*``: driver-side wall time of each
phase, including dispatch; ``worker_*``: time inside the workers), s/step, and response tokens/s
(= mean response length × prompts·n / step time, per step, then the median: the non-pad tokens sampled);
``peak_rss_gb_per_worker``: a worker process's peak resident memory over its life up to the last step
(``workers.runtime.perf.peak_rss_bytes``; the mean over workers); ``perf``: the workers' MFU of the updates
(``mfu/actor``, ``mfu/critic``), their peak and memory, and ``mfu/step``, the whole step's model FLOPs over
step time × workers × peak (``workers/runtime/perf.py``).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from typing import Any

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

PERF_METRICS = ("perf/mfu", "perf/peak", "perf/max", "perf/cpu")  # the workers' (perf/throughput is above)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    add_batch_args(parser)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (GPUs on CUDA)")
    return parser.parse_args(argv)


def start_ray(workers: int, device: str) -> None:
    """A local Ray cluster: one CPU slot per worker plus the driver's on CPU; Ray counts the GPUs on CUDA."""
    import ray

    env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}
    num_cpus = workers + 1 if device == "cpu" else None
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, runtime_env=env)


def run_steps(trainer: Any, warmup: int, steps: int) -> list[dict[str, float]]:
    """Metrics of the ``steps`` measured train steps (after ``warmup`` unmeasured ones)."""
    from single_controller.data_proto import DataProto

    batches = cycle(trainer.train_dataloader)
    measured = []
    for i in range(warmup + steps):
        trainer.global_step += 1
        metrics = trainer.train_step(DataProto.from_single_dict(next(batches)))
        if i >= warmup:
            measured.append(metrics)
    return measured


@functools.cache
def flops_model(
    path: str, value_model: bool = False, lora_rank: int = 0, target_modules: str | tuple[str, ...] = "all-linear"
) -> Any:
    """The ``workers.runtime.perf.FlopsModel`` of the checkpoint at ``path`` (a value model: its scalar head, no
    lm_head), with the workers' LoRA adapters where ``lora_rank`` > 0 (its frozen base computes no weight gradients)."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    from workers.parallel import lora
    from workers.runtime.perf import FlopsModel

    config = AutoConfig.from_pretrained(path, **({"num_labels": 1} if value_model else {}))
    auto_class = AutoModelForTokenClassification if value_model else AutoModelForCausalLM
    # alpha only scales the adapters' output: the FLOPs do not depend on it
    adapters = SimpleNamespace(lora_rank=lora_rank, lora_alpha=lora_rank, target_modules=target_modules)
    with torch.device("meta"):  # parameter shapes only, no memory
        return FlopsModel.of(lora.add_adapters(auto_class.from_config(config), adapters))


def actor_flops_model(cfg: Any) -> Any:
    """:func:`flops_model` of the actor that ``cfg`` trains (LoRA or not)."""
    model = cfg.actor_rollout_ref.model
    targets = model.target_modules
    return flops_model(
        model.path,
        lora_rank=int(model.lora_rank),
        target_modules=targets if isinstance(targets, str) else tuple(targets),
    )


def step_flops(cfg: Any, metrics: dict[str, float], sequences: int) -> float:
    """Model FLOPs of one step: generation and each forward that ran, the updates forward + backward.

    Approximate: every sequence counted at the step's mean prompt + response length, and generation as one
    forward over the whole sequences (decoding attends causally, so this slightly overcounts its attention).
    """
    import torch

    from planner.phases import uses_full_kl

    seq_lens = torch.full((sequences,), metrics["prompt_length/mean"] + metrics["response_length/mean"])
    ran = {k.removeprefix("timing_s/") for k in metrics if k.startswith("timing_s/")}
    actor_cfg, actor_path = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.model.path
    actor = actor_flops_model(cfg)
    forwards = 1 + ("old_log_prob" in ran) + ("ref" in ran)  # generation, old and ref log-probs
    flops = forwards * actor.forward_flops(seq_lens)
    flops += actor.update_flops(seq_lens, actor_cfg.ppo_epochs, reference_forward=uses_full_kl(actor_cfg))
    if "values" in ran:
        critic = flops_model(cfg.critic.model.path or actor_path, value_model=True)
        flops += critic.forward_flops(seq_lens)
        if "update_critic" in ran:
            flops += critic.update_flops(seq_lens, cfg.critic.ppo_epochs)
    return flops


def step_mfu(cfg: Any, measured: list[dict[str, float]], sequences: int, n_workers: int) -> float:
    """Median over steps of the step's model FLOPs / (step time × every worker's peak FLOP/s)."""
    return statistics.median(
        step_flops(cfg, m, sequences) / (m["timing_s/step"] * n_workers * m["perf/peak_tflops"] * 1e12)
        for m in measured
    )


def summarize(measured: list[dict[str, float]], sequences: int, n_workers: int) -> dict[str, Any]:
    """Medians of step time, phase times and throughput over the measured steps."""
    step_s = [m["timing_s/step"] for m in measured]
    tokens = [m["response_length/mean"] * sequences for m in measured]
    timings = medians([{k: v for k, v in m.items() if k.startswith("timing_s/")} for m in measured])
    perf = medians([{k: v for k, v in m.items() if k.startswith(PERF_METRICS)} for m in measured], ndigits=5)
    return {
        "s_per_step": round(statistics.median(step_s), 4),
        "s_per_step_all": [round(s, 4) for s in step_s],
        "response_tokens_per_s": round(statistics.median(t / s for t, s in zip(tokens, step_s)), 1),
        "response_length_mean": round(statistics.median(m["response_length/mean"] for m in measured), 3),
        "perf_throughput_tokens_per_s_per_worker": round(statistics.median(m["perf/throughput"] for m in measured), 1),
        # VmHWM only grows: the last step's is the run's; the driver averages the workers' figures
        "peak_rss_gb_per_worker": round(max(m["perf/cpu_memory_peak_gb"] for m in measured), 3),
        "timing_s": {k.removeprefix("timing_s/"): v for k, v in timings.items()},
        "perf": {k.removeprefix("perf/"): v for k, v in perf.items()},
        "score_mean": round(statistics.median(m["critic/score/mean"] for m in measured), 4),
        "workers": n_workers,
    }


def main(argv: list[str] | None = None) -> None:
    import ray

    from trainer.running.build import build_trainer

    args = parse_args(argv)
    with vocabulary_variant(args), tempfile.TemporaryDirectory(prefix="colorl-bench-step-") as local_dir:
        cfg = load_bench_config(args, args.workers, local_dir)
        with stdout_to_stderr():
            trainer = build_trainer(cfg)
        cfg = trainer.config  # with the assets' paths filled in
        start_ray(args.workers, args.device)
        try:
            start = time.perf_counter()
            with stdout_to_stderr():
                trainer.init_workers()
            init_s = time.perf_counter() - start
            measured = run_steps(trainer, args.warmup, args.steps)
        finally:
            ray.shutdown()
        result = summarize(measured, args.prompts * args.n, args.workers)
        result["perf"]["mfu/step"] = round(step_mfu(cfg, measured, args.prompts * args.n, args.workers), 5)
    emit(
        {
            "benchmark": "step",
            "algo": args.algo,
            "kl": args.kl,
            "hidden": args.hidden,
            "layers": args.layers,
            "lora_rank": cfg.actor_rollout_ref.model.lora_rank,
            "model_path": cfg.actor_rollout_ref.model.path,
            "prompts": args.prompts,
            "n": args.n,
            "prompt_length": args.prompt_length,
            "response_length": args.response_length,
            "steps": args.steps,
            "warmup": args.warmup,
            "init_workers_s": round(init_s, 2),
            **result,
            "machine": machine(args.device),
        }
    )


if __name__ == "__main__":
    main()
