"""Sharded checkpoints (torch.distributed.checkpoint): every rank writes its own shard, and a checkpoint written by
2 ranks loads into 1 and back, model and optimizer state alike."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from tests.reliability.test_checkpoint_disk import build_role
from tests.workers.helpers import build_tiny_checkpoint, free_port, full_weights, init_gloo
from workers.checkpoint import shards

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state(model, optimizer) -> dict:
    """Unsharded weights and Adam moments by name (a collective under FSDP; {} off rank 0 for the moments)."""
    optim = get_optimizer_state_dict(model, optimizer, options=FULL)
    moments = {
        name: {k: v for k, v in state.items() if k in ("exp_avg", "exp_avg_sq")}
        for name, state in optim.get("state", {}).items()
    }
    return {"model": full_weights(model), "moments": moments}


def _rank(rank: int, world: int, port: int, model_dir: str, role_dir: str, mode: str, out: str) -> None:
    init_gloo(rank, world, port)
    torch.manual_seed(rank)
    model, optimizer, scheduler, tokenizer = build_role(model_dir)
    if mode == "save":
        shards.save_role(role_dir, model, optimizer, scheduler, tokenizer)
    else:
        shards.load_role(role_dir, model, optimizer, scheduler)
    state = full_state(model, optimizer)
    if rank == 0:
        torch.save(state, out)
    dist.destroy_process_group()


def run_ranks(world: int, *args) -> None:
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(rank, world, port, *args)) for rank in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    assert [p.exitcode for p in procs] == [0] * world


def assert_same(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys() and a["moments"].keys() == b["moments"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(a["moments"][n][k], b["moments"][n][k]) for n in a["moments"] for k in a["moments"][n])


def test_two_ranks_write_a_shard_each_and_one_rank_loads_them(tmp_path):
    model_dir = build_tiny_checkpoint(tmp_path / "model", hidden=64)
    role_dir = tmp_path / "actor"
    run_ranks(2, model_dir, str(role_dir), "save", str(tmp_path / "saved.pt"))
    files = sorted(role_dir.glob("*.distcp"))
    assert [p.name for p in files] == ["__0_0.distcp", "__1_0.distcp"]
    sizes = [p.stat().st_size for p in files]
    assert max(sizes) < 0.75 * sum(sizes)  # each rank wrote its own part, not the whole model

    model, optimizer, scheduler, _ = build_role(model_dir)  # one process, unsharded, its own different state
    shards.load_role(str(role_dir), model, optimizer, scheduler)
    assert_same(full_state(model, optimizer), torch.load(tmp_path / "saved.pt"))


def test_one_rank_writes_and_two_ranks_load(tmp_path):
    model_dir = build_tiny_checkpoint(tmp_path / "model", hidden=64)
    role_dir = tmp_path / "actor"
    model, optimizer, scheduler, tokenizer = build_role(model_dir)
    shards.save_role(str(role_dir), model, optimizer, scheduler, tokenizer)
    run_ranks(2, model_dir, str(role_dir), "load", str(tmp_path / "loaded.pt"))
    assert_same(torch.load(tmp_path / "loaded.pt"), full_state(model, optimizer))
