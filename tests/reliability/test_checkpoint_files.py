"""The checkpoint files themselves, in one process: what loading refuses, what survives a crash, what is verified."""

import contextlib
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from config import ConfigError
from tests.workers.helpers import build_tiny_checkpoint
from trainer.export import export
from trainer.state.checkpoint import COMPLETE, CheckpointError, CheckpointManager, check_checkpoint, load_driver_state
from workers.checkpoint import safe_files, shards


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
    torch.save(shards.rng_state(), tmp_path / "rng.pt")
    expected = torch.rand(3), np.random.rand(3), random.random()
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    shards.set_rng_state(safe_files.load_plain(tmp_path / "rng.pt"))
    got = torch.rand(3), np.random.rand(3), random.random()
    assert torch.equal(expected[0], got[0]) and np.array_equal(expected[1], got[1]) and expected[2] == got[2]


def craft(role_dir: Path, name: str, payload: Payload, model, optimizer) -> None:
    """Put ``payload`` into file ``name`` of a saved role, as an attacker with write access could."""
    import pickle

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    if name == ".metadata":
        (role_dir / name).write_bytes(pickle.dumps(payload))
    elif name.endswith(".distcp"):  # a shard whose optimizer hyper-parameter unpickles into the payload
        optim_state = get_optimizer_state_dict(model, optimizer)
        optim_state["param_groups"][0]["lr"] = payload
        dcp.save({"model": get_model_state_dict(model), "optimizer": optim_state}, checkpoint_id=role_dir)
    else:
        torch.save({"state": payload}, role_dir / name)


@pytest.mark.parametrize("name", [".metadata", "__0_0.distcp", "extra.pt", "rng_rank0.pt"])
def test_a_crafted_pickle_in_a_role_is_refused_and_runs_nothing(role, tmp_path, name):
    model, optimizer, scheduler, tokenizer = role
    shards.save_role(str(tmp_path / "actor"), model, optimizer, scheduler, tokenizer)
    marker = tmp_path / "pwned"
    craft(tmp_path / "actor", name, Payload(marker), model, optimizer)
    with pytest.raises(safe_files.UnsafeCheckpointError, match="refusing to load .*(not part of|holds pickled)"):
        shards.load_role(str(tmp_path / "actor"), model, optimizer, scheduler)
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
    state = {
        "global_step": 1,
        "epoch": 0,
        "batch_in_epoch": 1,
        "epoch_start_rng": torch.ByteTensor(8),
        "kl_ctrl": {"value": 0.1},
        "wandb_run_id": None,
    }
    final = manager.commit(staging, 1, state)
    assert load_driver_state(final)["kl_ctrl"] == {"value": 0.1}


def committed(manager: CheckpointManager, step: int, role=None) -> Path:
    """Commit checkpoint ``step`` under ``manager``: the tiny role's files when given, else a stand-in file."""
    staging = manager.staging_path(step)
    manager.make_staging(staging)
    if role is None:
        (staging / "actor").mkdir()
        (staging / "actor" / "model.safetensors").write_bytes(bytes(range(256)) * 8)
    else:
        shards.save_role(str(staging / "actor"), *role)
    return manager.commit(staging, step, {"global_step": step})


def test_a_flipped_byte_is_found_and_the_file_named(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    final = committed(manager, 1)
    weights = final / "actor" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[100] ^= 1  # same size: only a checksum sees it
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="actor/model.safetensors does not match its SHA-256 checksum"):
        manager.find("resume_path", str(final))


class PowerCut(Exception):
    pass


@pytest.mark.parametrize("resave", [False, True], ids=["next_step", "same_step"])
def test_a_crash_at_any_point_of_a_commit_leaves_a_loadable_checkpoint(tmp_path, monkeypatch, resave):
    """With one checkpoint kept, cut the commit short before each of its renames and deletions in turn."""
    import os
    import shutil

    for cut_at in range(8):
        root = tmp_path / str(cut_at)
        committed(CheckpointManager(str(root), max_actor_ckpt_to_keep=1), 1)
        calls = [0]

        def cut(real, calls=calls, cut_at=cut_at):
            def call(*args, **kwargs):
                calls[0] += 1
                if calls[0] == cut_at + 1:
                    raise PowerCut
                return real(*args, **kwargs)

            return call

        with monkeypatch.context() as patch:
            for module, name in ((os, "rename"), (os, "replace"), (shutil, "rmtree")):
                patch.setattr(module, name, cut(getattr(module, name)))
            with contextlib.suppress(PowerCut):
                committed(CheckpointManager(str(root), max_actor_ckpt_to_keep=1), 1 if resave else 2)
        found = CheckpointManager(str(root), max_actor_ckpt_to_keep=1).find("auto")
        assert found is not None, f"no loadable checkpoint after a cut at operation {cut_at}"
        check_checkpoint(found)


def test_every_file_and_directory_is_on_disk_before_the_commit_rename(tmp_path, monkeypatch, role):
    import os

    events = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rename(src, dst):
        events.append(("rename", os.fspath(src), os.fspath(dst)))
        return real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    manager = CheckpointManager(str(tmp_path))
    final = committed(manager, 1, role)
    commit = events.index(("rename", os.fspath(manager.staging_path(1)), os.fspath(final)))
    # COMPLETE and DCP's .metadata are written as .COMPLETE.tmp / .metadata.tmp, flushed, then renamed
    synced = {
        event[1]
        .replace(os.fspath(manager.staging_path(1)), os.fspath(final))
        .replace(".COMPLETE.tmp", COMPLETE)
        .replace(".metadata.tmp", ".metadata")
        for event in events[:commit]
        if event[0] == "fsync"
    }
    on_disk = {os.fspath(p) for p in [final, *final.rglob("*")]}
    assert on_disk - synced == set()
    assert ("fsync", os.fspath(tmp_path)) in events[commit:]  # the rename itself, before anything is pruned


@pytest.mark.parametrize("earlier", ["checkpoint", "metrics"])
def test_a_fresh_run_refuses_a_directory_holding_an_earlier_run(tmp_path, earlier):
    manager = CheckpointManager(str(tmp_path))
    (tmp_path / "hydra").mkdir()  # Hydra's own output is there from the start: not a run
    assert manager.find("disable") is None
    if earlier == "checkpoint":
        committed(manager, 3)
    else:
        (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(  # the user's key: a config error (one line, exit status 2)
        ConfigError,
        match="trainer.resume_mode=disable, but trainer.default_local_dir=.* already "
        "holds a run .*trainer.resume_mode=auto",
    ):
        manager.find("disable")


def test_export_refuses_a_non_empty_out_unless_told_to_replace_it(tmp_path, role):
    run = tmp_path / "run"
    committed(CheckpointManager(str(run)), 1, role)
    out = tmp_path / "out"
    out.mkdir()
    (out / "model-00001-of-00002.safetensors").write_bytes(b"an earlier export")
    with pytest.raises(FileExistsError, match="--overwrite"):
        export(str(run), str(out))
    assert (out / "model-00001-of-00002.safetensors").exists()  # untouched
    export(str(run), str(out), overwrite=True)
    assert not (out / "model-00001-of-00002.safetensors").exists()  # replaced, not merged into
    assert AutoModelForCausalLM.from_pretrained(out) is not None


def test_export_overwrite_never_deletes_a_run_and_checks_the_checkpoint_first(tmp_path, role):
    run = tmp_path / "runs" / "a"
    committed(CheckpointManager(str(run)), 1, role)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    for out, named in (
        (run, "holds the checkpoint being exported"),
        (tmp_path / "runs", "holds the checkpoint"),
        (run / "global_step_1", "holds the checkpoint"),
    ):
        with pytest.raises(FileExistsError, match=f"--out {out} {named}.*--overwrite would delete it"):
            export(str(run / "global_step_1"), str(out), overwrite=True)
    other = tmp_path / "other"
    committed(CheckpointManager(str(other / "nested")), 1, role)
    with pytest.raises(FileExistsError, match=rf"--out {other} is or holds a run directory \({other}/nested/"):
        export(str(run), str(other), overwrite=True)
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")  # an earlier export
    weights = run / "global_step_1" / "actor" / "__0_0.distcp"
    weights.write_bytes(weights.read_bytes()[:-1])
    with pytest.raises(CheckpointError, match="__0_0.distcp has .* bytes instead of"):
        export(str(run / "global_step_1"), str(out), overwrite=True)
    assert (out / "config.json").exists() and (run / "metrics.jsonl").exists()  # nothing deleted
    assert len(list(run.rglob("*.distcp"))) == 1


def test_a_resume_loads_the_saved_state_but_keeps_the_configured_hyper_parameters(role, tmp_path):
    """Weights and Adam moments are the checkpoint's; lr, betas and weight decay this run's (the driver says so)."""
    model, optimizer, scheduler, tokenizer = role
    shards.save_role(str(tmp_path / "actor"), model, optimizer, scheduler, tokenizer)
    fresh = AutoModelForCausalLM.from_pretrained(tokenizer.name_or_path)
    optim = torch.optim.AdamW(fresh.parameters(), lr=5e-3, betas=(0.8, 0.99), weight_decay=0.1)
    warmup = torch.optim.lr_scheduler.LambdaLR(optim, lambda step: min(1.0, (step + 1) / 4))
    shards.load_role(str(tmp_path / "actor"), fresh, optim, warmup)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), fresh.parameters()))
    saved, loaded = optimizer.state_dict()["state"], optim.state_dict()["state"]
    assert all(torch.equal(saved[i][k], loaded[i][k]) for i in saved for k in ("step", "exp_avg", "exp_avg_sq"))
    assert warmup.last_epoch == scheduler.last_epoch == 1  # the schedule's position is the checkpoint's
    group = optim.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"]) == (5e-3 * 2 / 4, (0.8, 0.99), 0.1)
