"""Checkpoints on CPU: exact resume, elastic resume (2 ranks to 1), wandb continuity, HF export, corrupted/partial
checkpoints, a full disk."""

import contextlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import AutoModelForCausalLM, AutoTokenizer

from config import ConfigError
from planner import load_config
from tests.e2e.test_ppo_e2e import read_jsonl
from tests.reliability.conftest import tmpfs
from tests.wandb_offline import history, run_files, wandb_records
from trainer.export import export
from trainer.running.build import build_trainer
from trainer.state.checkpoint import COMPLETE, CheckpointError, CheckpointManager

# metrics that are pure functions of the computation (not of wall time)
COMPARED = [
    "critic/score/mean",
    "actor/pg_loss",
    "actor/ppo_kl",
    "actor/grad_norm",
    "actor/entropy",
    "response_length/mean",
]


def config(tmp_path, steps: int, n_workers: int = 2, *extra: str):
    return load_config(
        [
            f"builtin.cache_dir={tmp_path.parent / 'assets'}",
            "builtin.hidden_size=32",
            "builtin.num_train=16",
            "builtin.num_val=4",
            "builtin.sft_warmup_steps=2",
            "data.train_batch_size=4",
            "data.max_response_length=5",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "algorithm.adv_estimator=grpo",
            f"trainer.n_gpus_per_node={n_workers}",
            "trainer.device=cpu",
            f"trainer.total_training_steps={steps}",
            "trainer.test_freq=6",  # validates at the last step only (verl: when test_freq > 0)
            "trainer.val_before_train=false",
            "trainer.save_freq=3",
            "trainer.deterministic=true",
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[file,wandb]",
            *extra,
        ]
    )


def run(cfg, reloaded: Path | None = None):
    """Build, start and fit a trainer; with ``reloaded``, first load its checkpoint and write the actor's state,
    as loaded, there (before ``fit``, which loads the same checkpoint again), and record the watchdog's phases."""
    trainer = build_trainer(cfg)
    trainer.phases = watch_phases(trainer)
    trainer.init_workers()
    trainer.reloaded = reloaded
    if reloaded is not None:
        assert trainer.load_checkpoint()
        trainer.actor_rollout_wg.save_checkpoint(str(reloaded / "actor"))
    trainer.fit()
    return trainer


def watch_phases(trainer) -> dict[str, list]:
    """The phases the watchdog armed (``entered``), and those armed while validation rewards were computed."""
    seen, active, watched = {"entered": [], "val_reward": []}, [], trainer.watchdog.phase
    reward_fn = trainer.val_reward_fn

    @contextlib.contextmanager
    def phase(name):
        seen["entered"].append(name)
        active.append(name)
        try:
            with watched(name):
                yield
        finally:
            active.pop()

    def val_reward_fn(batch):
        seen["val_reward"].append(list(active))
        return reward_fn(batch)

    trainer.watchdog.phase, trainer.val_reward_fn = phase, val_reward_fn
    return seen


def role_state(role_dir: Path, scratch: Path) -> dict:
    """Every tensor and value of a role's shards (model and optimizer), unsharded, read in this process."""
    out = scratch / f"{role_dir.parent.name}.pt"
    dcp_to_torch_save(role_dir, out)
    return torch.load(out, weights_only=False)


def assert_same(saved, loaded, where: str = "") -> None:
    if isinstance(saved, torch.Tensor):
        assert torch.equal(saved, loaded), where
    elif isinstance(saved, dict):
        assert saved.keys() == loaded.keys(), where
        for key in saved:
            assert_same(saved[key], loaded[key], f"{where}.{key}")
    elif isinstance(saved, (list, tuple)):
        assert len(saved) == len(loaded), where
        for i, (a, b) in enumerate(zip(saved, loaded)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert saved == loaded, where


@pytest.fixture(scope="module")
def straight_and_resumed(ray_cluster, tmp_path_factory):
    """6 steps in one go; and 3 steps, stop, resume, 3 more (6 steps > 4 batches: crosses an epoch)."""
    straight_dir, resumed_dir = tmp_path_factory.mktemp("straight"), tmp_path_factory.mktemp("resumed")
    run(config(straight_dir, 6))
    first = run(config(resumed_dir, 3))
    second = run(config(resumed_dir, 6), reloaded=tmp_path_factory.mktemp("reloaded"))
    return straight_dir, resumed_dir, first, second


def test_resume_loads_the_saved_weights_and_optimizer_state(straight_and_resumed, tmp_path):
    _, resumed_dir, _, second = straight_and_resumed
    saved = role_state(resumed_dir / "global_step_3" / "actor", tmp_path)
    assert saved["optimizer"]["state"]  # Adam's moments are there to compare
    assert_same(saved, role_state(second.reloaded / "actor", tmp_path))


def test_the_watchdog_covers_model_loading_checkpoint_loading_and_the_validation_reward(straight_and_resumed):
    phases = straight_and_resumed[3].phases
    assert {"init_model", "load_checkpoint", "validate", "save_checkpoint"} <= set(phases["entered"])
    assert phases["val_reward"] and all("validate" in active for active in phases["val_reward"])


def test_resume_gives_identical_metrics(straight_and_resumed):
    straight_dir, resumed_dir, _, _ = straight_and_resumed
    straight = {r["step"]: r for r in read_jsonl(straight_dir / "metrics.jsonl")}
    resumed = {r["step"]: r for r in read_jsonl(resumed_dir / "metrics.jsonl")}
    assert sorted(resumed) == [1, 2, 3, 4, 5, 6]
    for step in (1, 2, 3, 4, 5, 6):  # 1-3: two runs with one seed agree; 4-6: so does a resumed one
        assert {k: resumed[step][k] for k in COMPARED} == {k: straight[step][k] for k in COMPARED}, step


def test_resumed_run_appends_to_the_same_wandb_run(straight_and_resumed):
    _, resumed_dir, first, second = straight_and_resumed
    assert first.wandb_run_id == second.wandb_run_id
    segments = run_files(resumed_dir, second.wandb_run_id)
    assert len(segments) == 2
    assert [row["_step"] for path in segments for row in history(wandb_records(path))] == [1, 2, 3, 4, 5, 6]


def test_checkpoints_are_complete_and_pointed_to(straight_and_resumed):
    _, resumed_dir, _, _ = straight_and_resumed
    assert (resumed_dir / "latest_checkpointed_iteration.txt").read_text() == "6"
    assert json.loads((resumed_dir / "global_step_3" / COMPLETE).read_text())["step"] == 3
    assert not list(resumed_dir.glob(".global_step_*"))  # no staging directory left behind


def test_export_loads_and_generates(straight_and_resumed, tmp_path):
    _, resumed_dir, _, _ = straight_and_resumed
    out = export(str(resumed_dir), str(tmp_path / "hf"))
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("r123>", return_tensors="pt").input_ids
    generated = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert generated.shape[1] > ids.shape[1]


def test_elastic_resume_with_one_worker(straight_and_resumed, tmp_path):
    _, resumed_dir, _, _ = straight_and_resumed
    shutil.copytree(resumed_dir / "global_step_6", tmp_path / "global_step_6")
    trainer = run(config(tmp_path, 7, 1, "trainer.logger=[file]"), reloaded=tmp_path / "reloaded")
    # the one worker holds exactly what the two saved: every weight, every Adam moment and step count
    assert_same(
        role_state(resumed_dir / "global_step_6" / "actor", tmp_path),
        role_state(tmp_path / "reloaded" / "actor", tmp_path),
    )
    assert trainer.global_step == 7 and [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [7]
    saved = AutoModelForCausalLM.from_pretrained(
        export(str(resumed_dir / "global_step_6"), str(tmp_path / "6"))
    ).state_dict()
    now = AutoModelForCausalLM.from_pretrained(
        export(str(tmp_path / "global_step_7"), str(tmp_path / "7"))
    ).state_dict()
    assert any(not torch.equal(saved[k], now[k]) for k in saved)  # it trained on from the loaded weights


def test_corrupted_latest_falls_back_to_previous(straight_and_resumed, tmp_path):
    _, resumed_dir, _, _ = straight_and_resumed
    for step in (3, 6):
        shutil.copytree(resumed_dir / f"global_step_{step}", tmp_path / f"global_step_{step}")
    weights = next((tmp_path / "global_step_6" / "actor").glob("*.distcp"))
    weights.write_bytes(weights.read_bytes()[:100])  # truncated, as by a crash or a bad disk
    manager = CheckpointManager(str(tmp_path))
    with pytest.warns(UserWarning, match="corrupted"):
        assert manager.find("auto") == tmp_path / "global_step_3"
    with pytest.raises(CheckpointError, match="corrupted"):
        manager.find("resume_path", str(tmp_path / "global_step_6"))


def test_interrupted_save_is_ignored(straight_and_resumed, tmp_path):
    _, resumed_dir, _, _ = straight_and_resumed
    shutil.copytree(resumed_dir / "global_step_3", tmp_path / "global_step_3")
    shutil.copytree(resumed_dir / "global_step_6", tmp_path / "global_step_9")  # renamed in place, marker lost
    (tmp_path / "global_step_9" / COMPLETE).unlink()
    (tmp_path / ".global_step_12.staging").mkdir()  # a save killed half way
    with pytest.warns(UserWarning, match="no COMPLETE marker"):
        assert CheckpointManager(str(tmp_path)).find("auto") == tmp_path / "global_step_3"


def test_resume_with_a_different_model_is_a_clear_error(straight_and_resumed, tmp_path):
    _, resumed_dir, _, _ = straight_and_resumed
    overrides = (
        "builtin.hidden_size=48",
        "trainer.resume_mode=resume_path",
        "trainer.logger=[file]",
        f"trainer.resume_from_path={resumed_dir / 'global_step_6'}",
    )
    with pytest.raises(ConfigError, match="it was saved with a different config: ") as info:
        build_trainer(config(tmp_path, 7, 2, *overrides))  # before any worker starts
    assert "builtin.hidden_size 32 -> 48" in str(info.value)
    assert "actor_rollout_ref.model.architecture.hidden_size 32 -> 48" in str(info.value)
    accepted = "trainer.resume_accept_changes=[builtin,actor_rollout_ref.model,critic.model,data.train_files]"
    trainer = build_trainer(config(tmp_path, 7, 2, *overrides, accepted))
    trainer.init_workers()
    with pytest.raises(CheckpointError, match="does not fit this model"):  # then the shards themselves say so
        trainer.fit()


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs: big enough for one tiny checkpoint, easy to fill up."""
    with tmpfs(tmp_path / "disk", "3M") as mount:
        yield mount


@pytest.mark.slow  # ~17 s (a disk filling mid-file on every rank: tests/reliability/test_checkpoint_disk.py)
def test_full_disk_keeps_the_previous_checkpoint(ray_cluster, tmp_path, small_disk):
    trainer = build_trainer(
        config(small_disk, 1, 2, "trainer.logger=[]", "trainer.save_freq=1", f"builtin.cache_dir={tmp_path / 'assets'}")
    )
    trainer.init_workers()
    trainer.fit()
    with open(small_disk / "filler", "wb") as filler:  # fill the disk to the last byte
        with contextlib.suppress(OSError):
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
    trainer.global_step = 2
    with pytest.raises(
        CheckpointError,
        match=r"step 2 failed \(rank \d could not write the checkpoint to "
        r".*\.global_step_2\.staging/actor: .*MiB free on that file system\).*intact: .*global_step_1",
    ):
        trainer.save_checkpoint()
    (small_disk / "filler").unlink()
    assert CheckpointManager(str(small_disk)).find("auto") == small_disk / "global_step_1"
    assert not list(small_disk.glob(".global_step_*"))
