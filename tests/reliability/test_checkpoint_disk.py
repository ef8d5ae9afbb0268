"""A disk that fills up in the middle of a checkpoint file: real writes on a small tmpfs, one and two ranks."""

import contextlib
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, AutoTokenizer

from config.sections import FSDPConfig
from tests.reliability.conftest import tmpfs
from tests.workers.helpers import build_tiny_checkpoint, free_port, init_gloo
from trainer.state.checkpoint import CheckpointManager
from workers.checkpoint import safe_files, shards
from workers.roles.role import shard_role


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs: room for a few tiny checkpoints, easy to fill."""
    with tmpfs(tmp_path / "disk", "2M") as mount:
        yield mount


def fill(disk: Path, leave: int) -> None:
    """Write a filler file until only ``leave`` bytes (rounded down to pages) are free on ``disk``."""
    import shutil

    with open(disk / "filler", "wb") as filler, contextlib.suppress(OSError):
        while (free := shutil.disk_usage(disk).free) > leave:
            filler.write(b"\0" * min(65536, free - leave))
            filler.flush()


def build_role(model_dir: str):
    """A model as a worker places it (FSDP over the ranks of the process group, plain in a single process)."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    where = SimpleNamespace(device=torch.device("cpu"), world_size=world)
    model, _ = shard_role(where, AutoModelForCausalLM.from_pretrained(model_dir), FSDPConfig(), trained=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    ids = torch.randint(3, 40, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    return model, optimizer, scheduler, AutoTokenizer.from_pretrained(model_dir)


def _rank(rank: int, world: int, port: int, model_dir: str, target: str, results) -> None:
    init_gloo(rank, world, port, timeout_s=60)
    try:
        shards.save_role(target, *build_role(model_dir))
        results.put((rank, "saved"))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        results.put((rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("model"), hidden=64)


@pytest.fixture(scope="module")
def sizes(model_dir, tmp_path_factory) -> dict[str, int]:
    """Each file's size in a checkpoint of the tiny model, written on an ordinary disk."""
    target = tmp_path_factory.mktemp("sizes") / "actor"
    shards.save_role(str(target), *build_role(model_dir))
    return {p.name: p.stat().st_size for p in target.iterdir()}


@pytest.mark.parametrize("full_in", ["shards", "config"])
def test_a_disk_filling_mid_file_fails_every_rank_with_the_path_and_free_space(small_disk, model_dir, sizes, full_in):
    """Space for a quarter of the shards (each rank writes about half, so one fails part-way), or for nothing."""
    fill(small_disk, sizes["__0_0.distcp"] // 4 if full_in == "shards" else 0)
    target = small_disk / "actor"
    ctx = mp.get_context("spawn")
    results, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, model_dir, str(target), results)) for r in range(2)]
    for p in procs:
        p.start()
    outcome = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    for rank in (0, 1):  # both ranks raise, neither waits for the other
        assert outcome[rank].startswith("CheckpointWriteError: rank "), outcome[rank]
        assert f"could not write the checkpoint to {target}: " in outcome[rank]
        assert "MiB free on that file system" in outcome[rank]


def test_a_driver_state_that_does_not_fit_is_an_os_error_naming_the_path(small_disk):
    manager = CheckpointManager(str(small_disk))
    staging = manager.staging_path(1)
    manager.make_staging(staging)
    fill(small_disk, 0)
    with pytest.raises(
        safe_files.CheckpointWriteError,
        match=rf"the driver could not write the checkpoint to "
        rf"{staging}: .*MiB free",
    ):
        manager.commit(staging, 1, {"global_step": 1, "blob": torch.zeros(100_000)})
