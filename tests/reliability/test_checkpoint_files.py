"""The checkpoint files themselves, in one process: what loading refuses, what survives a crash, what is verified."""

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.workers.helpers import build_tiny_checkpoint
from trainer.checkpoint import CheckpointError, CheckpointManager, load_driver_state
from workers import checkpoint


class Payload:
    """Unpickling this runs ``Path(marker).touch()``: the kind of object a crafted checkpoint would hold."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


@pytest.fixture(scope="module")
def role(tmp_path_factory):
    """(module, optimizer, scheduler, tokenizer) of a tiny Llama with AdamW state after one step."""
    path = build_tiny_checkpoint(tmp_path_factory.mktemp("model"))
    model = AutoModelForCausalLM.from_pretrained(path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    ids = torch.randint(3, 40, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler, AutoTokenizer.from_pretrained(path)


def test_rng_state_round_trips_through_plain_files(tmp_path):
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    torch.save(checkpoint.rng_state(), tmp_path / "rng.pt")
    expected = torch.rand(3), np.random.rand(3), random.random()
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    checkpoint.set_rng_state(checkpoint.load_plain(tmp_path / "rng.pt"))
    got = torch.rand(3), np.random.rand(3), random.random()
    assert torch.equal(expected[0], got[0]) and np.array_equal(expected[1], got[1]) and expected[2] == got[2]


@pytest.mark.parametrize("name", ["optimizer.pt", "extra.pt", "rng_rank0.pt"])
def test_a_crafted_pickle_in_a_role_is_refused_and_runs_nothing(role, tmp_path, name):
    model, optimizer, scheduler, tokenizer = role
    checkpoint.save_role(str(tmp_path / "actor"), model, optimizer, scheduler, tokenizer)
    marker = tmp_path / "pwned"
    torch.save({"state": Payload(marker)}, tmp_path / "actor" / name)
    with pytest.raises(checkpoint.UnsafeCheckpointError, match=f"refusing to load .*{name}: it holds pickled"):
        checkpoint.load_role(str(tmp_path / "actor"), model, optimizer, scheduler)
    assert not marker.exists()


def test_a_crafted_driver_state_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"global_step": 3, "kl_ctrl": Payload(marker)}, tmp_path / "driver.pt")
    with pytest.raises(CheckpointError, match="refusing to load .*driver.pt"):
        load_driver_state(tmp_path)
    assert not marker.exists()


def test_driver_state_is_plain(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    staging = manager.staging_path(1)
    manager.make_staging(staging)
    (staging / "actor").mkdir()
    state = {"global_step": 1, "epoch": 0, "batch_in_epoch": 1, "epoch_start_rng": torch.ByteTensor(8),
             "kl_ctrl": {"value": 0.1}, "wandb_run_id": None}
    final = manager.commit(staging, 1, state)
    assert load_driver_state(final)["kl_ctrl"] == {"value": 0.1}
