"""Peak memory per worker: FSDP over 2 ranks against one unsharded process, doing the same actor work.

    python -m benchmarks.memory [--hidden 512 --layers 8] [--prompts 16 --n 8] [--response-length 8]
                                [--world 2] [--updates 2] [--device cpu|cuda]

Each configuration runs in fresh processes (spawned, so one's memory never counts for another): load the
policy, shard it with ``workers.parallel.fsdp.apply_fsdp`` (FSDP run only), build AdamW, then on the rank's share of a
batch of prompts·n random sequences: a log-prob forward (``DataParallelPPOActor.compute_log_prob``) and
``--updates`` update steps (forward + backward + clip + AdamW; the optimizer state appears at the first).

Per rank (from the kernel's VmRSS / VmHWM): RSS after imports, after the model is set up, the exact peak
during the compute (the peak mark is reset before it), the lifetime peak (which includes loading the full
checkpoint before sharding), RSS at the end, and the compute peak above the RSS after imports (the part
the model, its gradients and optimizer state and the activations account for; torch + transformers are ~300 MB,
torch alone 219 MB).
``peak_by_phase_mb`` splits the compute peak by phase (log-prob forward, update forward + backward, optimizer
step), sampled every millisecond by a thread, so it shows where the peak is. On CUDA also
``torch.cuda.max_memory_allocated``. On CPU, its analogue ``peak_tensor_mb``: the most bytes that tensors held at
once, from a second pass of the same compute (params, buffers, optimizer state and batch at its start, plus
the peak of what it allocated, as the profiler's CPU memory reporter counts it) — the memory the sharding
acts on, without the imported libraries or what the allocator keeps after a free. Prints JSON with both runs
and the ratios FSDP rank / unsharded (max over ranks). The ranks each take 1/world of the batch, as the
trainer's workers do.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import add_model_args, default_device, emit, machine, run_ranks, stdout_to_stderr
from workers.runtime import malloc, perf

MB = 2**20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    parser.set_defaults(hidden=512, layers=8, sft_warmup_steps=0)  # big enough for the sharding to show
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=8)
    parser.add_argument("--response-length", type=int, default=8)
    parser.add_argument("--world", type=int, default=2, help="FSDP ranks")
    parser.add_argument("--updates", type=int, default=2, help="update steps after the log-prob forward")
    parser.add_argument(
        "--min-num-params",
        type=int,
        default=0,
        help="FSDP units of at least this many parameters (fsdp_config.wrap_policy; 0: per block)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default=default_device())
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def rss_mb() -> float:
    """This process's resident set size now."""
    return _status_kb("VmRSS") / 1024


def peak_rss_mb() -> float:
    """The highest RSS since the process started or since the last ``reset_peak_rss`` (the kernel's VmHWM)."""
    return perf.peak_rss_bytes() / 2**20


def reset_peak_rss() -> None:
    """Restart the kernel's peak-RSS mark at the current RSS (Linux >= 4.0: ``echo 5 > /proc/self/clear_refs``).

    Exact, unlike sampling; and unlike ``ru_maxrss``, which a spawned child inherits from its parent.
    """
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} (benchmarks.memory needs Linux)")


class PhasePeaks:
    """Peak RSS per labelled phase, from a daemon thread reading VmRSS every ``interval_s``."""

    def __init__(self, interval_s: float = 1e-3) -> None:
        self.phase, self.peaks, self.interval_s = "setup", {}, interval_s
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            self._record(self.phase)
            time.sleep(self.interval_s)

    def _record(self, phase: str) -> None:
        self.peaks[phase] = max(self.peaks.get(phase, 0.0), rss_mb())

    def enter(self, phase: str) -> None:
        """End the current phase with one last sample and start ``phase``: a small model's phase can be shorter
        than the sampling interval, and would otherwise go unrecorded."""
        self._record(self.phase)
        self.phase = phase

    def label_optimizer_steps(self, optimizer: torch.optim.Optimizer) -> None:
        """Label ``optimizer.step`` "optimizer_step"; what runs between two steps is "update_fwd_bwd"."""
        step = optimizer.step

        def labelled_step(*args, **kwargs):
            self.enter("optimizer_step")
            try:
                return step(*args, **kwargs)
            finally:
                self.enter("update_fwd_bwd")

        optimizer.step = labelled_step


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a DTensor by its local shard; None skipped)."""
    storages = {}
    for t in tensors:
        if t is not None:
            local = t.to_local() if isinstance(t, DTensor) else t
            storages[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
    return sum(storages.values())


def live_tensor_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Any) -> int:
    """What the actor holds between steps: parameters, buffers, gradients, optimizer state, the batch."""
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    params = [*model.parameters(), *(p for group in optimizer.param_groups for p in group["params"])]  # + masters
    return storage_bytes([*params, *(p.grad for p in params), *model.buffers(), *state, *data.batch.values()])


def allocated_peak_bytes(run: Callable[[], None]) -> int:
    """Peak CPU bytes allocated by ``run()`` above what was allocated before it.

    The profiler's CPU memory reporter (``profile_memory``) adds every allocation made while it records and
    subtracts its free; the running total is each ``[memory]`` event's ``Total Allocated``. A block allocated
    before and freed during ``run`` is never subtracted, so the figure errs high, never low.
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(os.path.join(tmp, "trace.json"))
        with open(os.path.join(tmp, "trace.json")) as f:
            events = json.load(f)["traceEvents"]
    cpu = [e["args"] for e in events if e.get("name") == "[memory]" and e["args"]["Device Type"] == 0]
    return max((a["Total Allocated"] for a in cpu), default=0)


def random_batch(rows: int, args: dict[str, Any], seed: int) -> Any:
    """A PPO batch (``rows`` sequences): random prompt and response tokens, random advantages."""
    from single_controller.data_proto import DataProto

    g = torch.Generator().manual_seed(seed)
    p, r, vocab = args["prompt_length"], args["response_length"], args["vocab_size"]
    input_ids = torch.randint(0, vocab, (rows, p + r), generator=g)
    attention_mask = torch.ones_like(input_ids)
    return DataProto.from_dict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": attention_mask.cumsum(-1) - 1,
            "responses": input_ids[:, p:],
            "response_mask": attention_mask[:, p:],
            "advantages": torch.randn(rows, r, generator=g),
        }
    )


def _setup(rank: int, world: int, args: dict[str, Any]) -> torch.device:
    """Threads, device and (for world > 1) the process group: gloo on CPU, nccl on CUDA."""
    import torch.distributed as dist

    cuda = args["device"] == "cuda"
    device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, args["threads"] // world))
        malloc.keep_freed_memory()  # the trainer's CPU workers' fallback where mimalloc is not installed
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args["port"]), RANK=str(rank), WORLD_SIZE=str(world))
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world, timeout=timedelta(minutes=10))
    return device


def _build_actor(args: dict[str, Any], device: torch.device, world: int) -> tuple[Any, Any, Any]:
    """(actor, module, optimizer) as a worker rank holds them in the default precision: FSDP over > 1 ranks;
    one rank plain, or computing on a bf16 copy of fp32 masters (bf16 on CUDA by default)."""
    from transformers import AutoModelForCausalLM

    from config.sections import ActorConfig, FSDPConfig, WrapPolicyConfig
    from workers.compute.actor import DataParallelPPOActor
    from workers.parallel.master_weights import optimizer_for
    from workers.roles.role import shard_role

    model = AutoModelForCausalLM.from_pretrained(args["model_path"], dtype=torch.float32)
    fsdp_config = FSDPConfig(wrap_policy=WrapPolicyConfig(min_num_params=args["min_num_params"]))
    model, weights = shard_role(SimpleNamespace(device=device, world_size=world), model, fsdp_config, trained=True)
    rows = args["sequences"] // world
    config = ActorConfig(ppo_mini_batch_size=rows, ppo_micro_batch_size_per_gpu=rows)
    optimizer = optimizer_for(model, weights, config.optim)
    return DataParallelPPOActor(model, optimizer, None, config, rows), model, optimizer


def _rank_main(rank: int, world: int, args: dict[str, Any], results: Any) -> None:
    """One rank: set up the actor (sharded when world > 1), then a log-prob forward and the update steps."""
    device = _setup(rank, world, args)
    rss_imported = rss_mb()
    phases = PhasePeaks()
    actor, model, optimizer = _build_actor(args, device, world)
    phases.label_optimizer_steps(optimizer)
    rows = args["sequences"] // world
    data = random_batch(rows, args, seed=args["seed"] + rank)
    peak_setup, rss_setup = peak_rss_mb(), rss_mb()

    def compute() -> None:
        phases.enter("log_prob")
        data.batch["old_log_probs"], _ = actor.compute_log_prob(data, rows)
        phases.enter("update_fwd_bwd")
        for _ in range(args["updates"]):
            actor.update_policy(data)

    reset_peak_rss()
    compute()
    time.sleep(10 * phases.interval_s)  # one more sample of the last phase
    peak_rss, rss_end = peak_rss_mb(), rss_mb()
    by_phase = {k: round(v, 1) for k, v in phases.peaks.items() if k != "setup"}
    tensor_peak = None
    if device.type == "cpu":  # the same work again, with the optimizer state in place, counting tensor bytes
        tensor_peak = live_tensor_bytes(model, optimizer, data) + allocated_peak_bytes(compute)
    result = {
        "rank": rank,
        "rss_imported_mb": rss_imported,
        "rss_setup_mb": rss_setup,
        "peak_rss_compute_mb": peak_rss,
        "peak_rss_lifetime_mb": max(peak_setup, peak_rss),
        "rss_end_mb": rss_end,
        "peak_by_phase_mb": by_phase,
    }
    # what the model, its optimizer state and the compute add on top of the imported libraries
    result["peak_compute_above_imports_mb"] = result["peak_rss_compute_mb"] - rss_imported
    if tensor_peak is not None:
        result["peak_tensor_mb"] = tensor_peak / MB
    if device.type == "cuda":
        result["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated(device) / MB
    results.put({k: round(v, 1) if isinstance(v, float) else v for k, v in result.items()})
    if world > 1:
        torch.distributed.destroy_process_group()


def _ratios(fsdp_ranks: list[dict[str, Any]], plain: dict[str, Any]) -> dict[str, float]:
    """Max over FSDP ranks / unsharded, for each memory figure."""
    keys = [k for k in plain if k.endswith("_mb") and isinstance(plain[k], float)]
    return {k.removesuffix("_mb"): round(max(r[k] for r in fsdp_ranks) / plain[k], 3) for k in keys if plain[k]}


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoConfig

    from data.builtin import prepare_builtin

    args = parse_args(argv)
    os.environ.update(malloc.worker_env(args.device))  # the spawned ranks start with the trainer's CPU allocator
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        raise SystemExit(
            f"benchmarks.memory: --world {args.world} needs {args.world} GPUs, {torch.cuda.device_count()} visible"
        )
    if args.model_path:
        model_path = os.path.abspath(args.model_path)
    else:
        with stdout_to_stderr():
            model_path = prepare_builtin(
                cache_dir=os.path.abspath(args.cache_dir),
                task=args.task,
                sft_warmup_steps=args.sft_warmup_steps,
                hidden_size=args.hidden,
                num_layers=args.layers,
                seed=args.seed,
            )["model_path"]
    model_config = AutoConfig.from_pretrained(model_path)
    shared = {
        "model_path": model_path,
        "vocab_size": model_config.vocab_size,
        "device": args.device,
        "sequences": args.prompts * args.n,
        "prompt_length": args.prompt_length,
        "response_length": args.response_length,
        "updates": args.updates,
        "seed": args.seed,
        "threads": os.cpu_count() or 1,
        "min_num_params": args.min_num_params,
    }
    sharded = run_ranks(_rank_main, args.world, shared)
    plain = run_ranks(_rank_main, 1, shared)[0]
    emit(
        {
            "benchmark": "memory",
            "hidden": args.hidden,
            "layers": args.layers,
            "model_path": model_path,
            "n_params": _n_params(model_config),
            "sequences": shared["sequences"],
            "tokens_per_sequence": args.prompt_length + args.response_length,
            "updates": args.updates,
            "min_num_params": args.min_num_params,
            f"fsdp_{args.world}_ranks": sharded,
            "unsharded": plain,
            "ratio_fsdp_rank_over_unsharded": _ratios(sharded, plain),
            "machine": machine(args.device),
        }
    )


def _n_params(model_config: Any) -> int:
    """Parameters of the model, counted on the meta device (no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config)
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    main()
