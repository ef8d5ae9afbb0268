"""One run per directory: the run lock, no silent restart, one history in metrics.jsonl, the config a checkpoint
was saved with compared on resume."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from config import ConfigError, replace_keys
from planner import load_config
from tests.reliability.conftest import REPO, child_env
from tests.workers.helpers import build_tiny_checkpoint
from trainer.observing.tracking import Tracking, read_metrics
from trainer.state import fingerprint
from trainer.state.checkpoint import COMPLETE, CheckpointError, CheckpointManager
from trainer.state.fingerprint import check_resume, config_record
from trainer.state.run_dir import LOCK, RunLockError, lock_run_dir

HOLD = (
    "import sys, time; from trainer.state.run_dir import lock_run_dir; lock_run_dir(sys.argv[1]); "
    "print('held', flush=True)"
)


def holder(run_dir: Path, then: str) -> subprocess.Popen:
    """Another process that takes ``run_dir``'s lock, then runs ``then``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"{HOLD}; {then}", str(run_dir)],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_driver_is_refused_with_the_holder_named(tmp_path):
    proc = holder(tmp_path, "time.sleep(600)")
    try:
        with pytest.raises(RunLockError) as info:
            lock_run_dir(str(tmp_path))
    finally:
        proc.kill()
        proc.wait()
    message = str(info.value)
    assert f"trainer.default_local_dir={tmp_path} is in use by another run: pid {proc.pid} on host " in message
    assert "(started 20" in message and "choose another trainer.default_local_dir" in message and "\n" not in message


@pytest.mark.parametrize("death", ["sigkill", "os._exit"])
def test_a_lock_left_by_a_dead_process_is_taken_over_with_a_line(tmp_path, capsys, death):
    proc = holder(tmp_path, "time.sleep(600)" if death == "sigkill" else "import os; os._exit(3)")
    if death == "sigkill":
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    lock_run_dir(str(tmp_path))
    err = capsys.readouterr().err
    assert f"colorl: taking over the run lock of {tmp_path} from pid {proc.pid} on host " in err
    assert "which ended without releasing it (killed or crashed)" in err
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()


def test_a_lock_released_at_exit_is_taken_without_a_word(tmp_path, capsys):
    proc = holder(tmp_path, "pass")
    assert proc.wait() == 0 and (tmp_path / LOCK).read_text() == ""
    lock_run_dir(str(tmp_path))
    lock_run_dir(str(tmp_path))  # again in the same process (a restart): still ours
    assert capsys.readouterr().err == ""


def test_an_unwritable_directory_is_a_config_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(
        ConfigError,
        match=rf"trainer.default_local_dir='{tmp_path}/file/run': cannot write there "
        r"\(NotADirectoryError: Not a directory\); choose a directory",
    ):
        lock_run_dir(str(tmp_path / "file" / "run"))


def damaged_checkpoint(root: Path, step: int, how: str) -> None:
    path = root / f"global_step_{step}" / "actor"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"\0" * 64)
    if how == "truncated":
        files = {"actor/model.safetensors": {"size": 128, "sha256": "0" * 64}}
        (root / f"global_step_{step}" / COMPLETE).write_text(json.dumps({"step": step, "files": files}))


def test_checkpoints_none_of_which_is_intact_stop_the_run_naming_each(tmp_path):
    damaged_checkpoint(tmp_path, 3, "unfinished")
    damaged_checkpoint(tmp_path, 6, "truncated")
    with pytest.warns(UserWarning), pytest.raises(CheckpointError) as info:
        CheckpointManager(str(tmp_path)).find("auto")
    message = str(info.value)
    assert f"trainer.default_local_dir={tmp_path} holds checkpoints, but none is intact: " in message
    assert "global_step_6 is corrupted: actor/model.safetensors has 64 bytes instead of 128" in message
    assert "global_step_3 is not a complete checkpoint (no COMPLETE marker" in message
    assert "\n" not in message


def tracking(run_dir: Path, resume_step: int) -> Tracking:
    return Tracking("p", "e", ["file"], {}, str(run_dir), resume_step=resume_step)


@pytest.mark.parametrize("resume_step", [0, 3])
def test_metrics_keep_one_history(tmp_path, capsys, resume_step):
    """Steps 1-5 logged, the last line cut by a full disk; the run resumes from step 3 (or starts again: 0)."""
    lines = [json.dumps({"step": s, "critic/score/mean": s / 10}) for s in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 6, "critic/sc')
    logger = tracking(tmp_path, resume_step)
    for step in range(resume_step + 1, resume_step + 3):
        logger.log({"critic/score/mean": 1.0}, step=step)
    logger.finish()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == list(range(1, resume_step + 3))
    err = capsys.readouterr().err
    when = f"after the checkpoint of step {resume_step}" if resume_step else "that left no checkpoint"
    assert f"colorl: metrics.jsonl: removing steps {resume_step + 1}-5, logged by an earlier attempt {when}" in err
    assert "removing a partial line (a full disk or a crash while writing)" in err
    assert (tmp_path / "reward_curve.png").exists()


def test_a_partial_last_line_does_not_stop_finish(tmp_path):
    logger = tracking(tmp_path, 0)
    logger.log({"critic/score/mean": 0.5}, step=1)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "critic/sco')  # what a full disk leaves
    logger.finish()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "critic/score/mean": 0.5}]


# ---------------------------------------------------------------------------------- the config fingerprint
@pytest.fixture(scope="module")
def saved():
    return load_config(["trainer.total_training_steps=4"])


def test_a_changed_model_data_batch_or_algorithm_is_refused_with_the_keys(saved, tmp_path):
    changed = replace_keys(
        saved,
        {
            "data.train_files": "/other.parquet",
            "data.train_batch_size": 8,
            "algorithm.adv_estimator": "rloo",
            "actor_rollout_ref.model.path": "/other/model",
        },
    )
    with pytest.raises(ConfigError) as info:
        check_resume(config_record(saved), changed, tmp_path)
    message = str(info.value)
    assert message.startswith(f"cannot resume from {tmp_path}: it was saved with a different config: ")
    for part in (
        "actor_rollout_ref.model.path null -> '/other/model'",
        "algorithm.adv_estimator 'grpo' -> 'rloo'",
        "data.train_batch_size 16 -> 8",
        "data.train_files null -> '/other.parquet'",
        "trainer.resume_accept_changes=[actor_rollout_ref.model.path,algorithm.adv_estimator,",
    ):
        assert part in message
    accepting = replace_keys(
        changed, {"trainer.resume_accept_changes": ["data", "actor_rollout_ref.model", "algorithm.adv_estimator"]}
    )
    lines = check_resume(config_record(saved), accepting, tmp_path)
    assert "resuming with data.train_batch_size changed: 16 -> 8 (accepted by trainer.resume_accept_changes)" in lines


def test_steps_logging_frequencies_and_layout_may_change(saved, tmp_path):
    changed = replace_keys(
        saved,
        {
            "trainer.total_training_steps": 9,
            "trainer.save_freq": 2,
            "trainer.test_freq": 3,
            "trainer.logger": ["file"],
            "trainer.n_gpus_per_node": 1,
            "trainer.phase_timeout_s": 60.0,
            "trainer.experiment_name": "longer",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
            "actor_rollout_ref.actor.fsdp_config.param_offload": True,
        },
    )
    assert check_resume(config_record(saved), changed, tmp_path) == []


def test_a_changed_optimizer_setting_is_applied_and_said(saved, tmp_path):
    changed = replace_keys(
        saved, {"actor_rollout_ref.actor.optim.lr": 1e-3, "actor_rollout_ref.actor.optim.betas": [0.8, 0.99]}
    )
    optim = saved.actor_rollout_ref.actor.optim
    applied = "(applied from the next update; the optimizer's moments and the schedule's step are kept)"
    assert check_resume(config_record(saved), changed, tmp_path) == [
        f"resuming with actor_rollout_ref.actor.optim.betas changed: {optim.betas} -> [0.8, 0.99] {applied}",
        f"resuming with actor_rollout_ref.actor.optim.lr changed: {optim.lr} -> 0.001 {applied}",
    ]


def test_a_model_of_another_shape_at_the_same_path_is_refused(saved, tmp_path):
    model = build_tiny_checkpoint(tmp_path / "model", hidden=32)
    build_tiny_checkpoint(tmp_path / "global_step_1" / "actor", hidden=48)  # the shape it was saved with
    cfg = replace_keys(saved, {"actor_rollout_ref.model.path": model})
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.model.architecture.hidden_size 48 -> 32"):
        check_resume(config_record(cfg), cfg, tmp_path / "global_step_1")


def test_the_keys_that_may_change_are_documented():
    doc = (REPO / "docs" / "reliability.md").read_text()
    missing = [p for p in (*fingerprint.MAY_CHANGE, *fingerprint.OPTIMIZER) if f"`{p}`" not in doc]
    assert missing == []


def test_a_checkpoint_records_its_config_in_plain_types(saved, tmp_path):
    torch.save({"config": config_record(saved)}, tmp_path / "driver.pt")
    assert torch.load(tmp_path / "driver.pt", weights_only=True)["config"] == config_record(saved)


def test_a_checkpoint_saved_before_keys_were_added_resumes(saved, tmp_path):
    """Keys new in the schema at their default do not block a resume; a new key set away from its default does
    (keys recorded under their older places: tests/verl_compat/cli/test_verl_resume.py)."""
    new_keys = ("algorithm.filter_groups.", "data.gen_batch_size", "distillation.")
    older = {key: value for key, value in config_record(saved).items() if not key.startswith(new_keys)}
    assert "algorithm.filter_groups.enable" not in older
    assert check_resume(older, saved, tmp_path) == []
    filtering = replace_keys(saved, {"algorithm.filter_groups.enable": True})
    with pytest.raises(ConfigError, match=r"algorithm\.filter_groups\.enable <not recorded> -> True"):
        check_resume(older, filtering, tmp_path)
