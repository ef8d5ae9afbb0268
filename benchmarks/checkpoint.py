"""Checkpoint save and load of one role: wall time and peak host memory per rank.

    python -m benchmarks.checkpoint [--hidden 512 --layers 8] [--world 1 2] [--repeats 3] [--dir /tmp]

Each world size runs in fresh spawned processes (gloo on CPU): build the built-in Llama of the given size
(33.6 M parameters by default), place it as a worker does (``workers.roles.role.shard_role``: FSDP over the ranks,
a world of one unsharded), give AdamW its state with one step; then, ``--repeats`` times:
``workers.checkpoint.shards.save_role`` into a checkpoint's staging directory, which rank 0 commits as the driver does
(``CheckpointManager.commit``) and verifies as a resume does (``check_checkpoint``), then ``load_role`` from it.
Per rank: the median seconds of each, and the peak RSS above the RSS just before save/load (the kernel's VmHWM,
reset before each call): the host memory the checkpoint code itself needs (a lower bound: memory that malloc
reuses from earlier frees is not counted).
Prints one JSON line with every world size's ranks and the checkpoint's size on disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks.common import add_model_args, emit, machine, run_ranks, stdout_to_stderr
from benchmarks.memory import peak_rss_mb, reset_peak_rss, rss_mb


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    parser.set_defaults(hidden=512, layers=8)
    parser.add_argument("--world", type=int, nargs="+", default=[1, 2], help="world sizes to measure")
    parser.add_argument("--repeats", type=int, default=3, help="save + load rounds per world size")
    parser.add_argument("--dir", default=None, help="where the checkpoints are written (default: a temp dir)")
    return parser.parse_args(argv)


def _build(args: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """(module, optimizer, scheduler, tokenizer) as a trainer rank holds them, AdamW state filled by one step."""
    from config.sections import FSDPConfig
    from data.builtin import build_char_tokenizer, build_tiny_model
    from workers.roles.role import shard_role

    tokenizer = build_char_tokenizer()
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    model = build_tiny_model(tokenizer, args["hidden"], args["layers"])
    where = SimpleNamespace(device=torch.device("cpu"), world_size=world)
    model, _ = shard_role(where, model, FSDPConfig(), trained=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    ids = torch.randint(3, len(tokenizer), (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler, tokenizer


def _measured(call: Any) -> tuple[float, float]:
    """(seconds, peak RSS above the RSS before, in MB) of ``call()``, between barriers."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
    reset_peak_rss()
    before, start = rss_mb(), time.perf_counter()
    call()
    if dist.is_initialized():
        dist.barrier()
    return time.perf_counter() - start, peak_rss_mb() - before


def _rank_main(rank: int, world: int, args: dict[str, Any], results: Any) -> None:
    import torch.distributed as dist

    from trainer.state.checkpoint import CheckpointManager, check_checkpoint
    from workers.checkpoint import shards

    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args["port"]), RANK=str(rank), WORLD_SIZE=str(world))
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(minutes=10))
    model, optimizer, scheduler, tokenizer = _build(args)
    rows = []
    manager = CheckpointManager(str(Path(args["dir"]) / f"world{world}"))
    for step in range(1, args["repeats"] + 1):
        staging = manager.staging_path(step)
        if rank == 0:
            manager.make_staging(staging)
        save_s, save_mb = _measured(
            lambda: shards.save_role(str(staging / "actor"), model, optimizer, scheduler, tokenizer)
        )
        # the driver's part, here on rank 0: checksum + fsync everything, rename; and verify before a resume
        commit_s, _ = _measured(lambda: manager.commit(staging, step, {"global_step": step}) if rank == 0 else None)
        final = Path(manager.root) / f"global_step_{step}"
        verify_s, _ = _measured(lambda: check_checkpoint(final) if rank == 0 else None)
        load_s, load_mb = _measured(lambda: shards.load_role(str(final / "actor"), model, optimizer, scheduler))
        size = sum(p.stat().st_size for p in final.rglob("*") if p.is_file())
        rows.append(
            {
                "save_s": save_s,
                "save_peak_mb": save_mb,
                "commit_s": commit_s,
                "verify_s": verify_s,
                "load_s": load_s,
                "load_peak_mb": load_mb,
                "size_mb": size / 2**20,
            }
        )
        if world > 1:
            dist.barrier()
        if rank == 0:
            shutil.rmtree(final)
    results.put({"rank": rank, **{k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}})
    if world > 1:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="colorl-bench-ckpt-", dir=args.dir) as root, stdout_to_stderr():
        shared = {"hidden": args.hidden, "layers": args.layers, "repeats": args.repeats, "dir": root}
        worlds = {str(world): run_ranks(_rank_main, world, shared) for world in args.world}
    n_params = 16 * args.hidden**2 * args.layers  # attention 4·h², MLP 3·h·4h per block; embeddings are tiny
    emit({"benchmark": "checkpoint", "params_m": round(n_params / 1e6, 1), "worlds": worlds, "machine": machine("cpu")})


if __name__ == "__main__":
    main()
