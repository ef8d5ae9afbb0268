"""Tracking backends: console line, metrics.jsonl, an offline W&B run read back from its file, the reward plot."""

import json

import numpy as np
import pytest
import torch

from tests.wandb_offline import history, run_file, wandb_records
from trainer.observing.tracking import Tracking, plot_reward_curve, read_metrics

VAL_KEY = "val-core/colorl/reverse/reward/mean@1"


def _log_steps(tracker: Tracking, steps: range) -> None:
    for step in steps:
        tracker.log(
            {"critic/score/mean": torch.tensor(step / 10), "actor/pg_loss": np.float32(-0.5), "timing_s/step": 0.25},
            step=step,
        )
        if step % 2 == 0:
            tracker.log({VAL_KEY: step / 5}, step=step)


def _is_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_file_backend_appends_one_json_object_per_step_and_plots(tmp_path):
    tracker = Tracking("colorl", "t", ["file"], config={}, local_dir=str(tmp_path), total_steps=4)
    _log_steps(tracker, range(1, 4))
    tracker.finish()
    resumed = Tracking("colorl", "t", ["file"], config={}, local_dir=str(tmp_path), total_steps=4, resume_step=2)
    _log_steps(resumed, range(3, 5))  # step 3 again, as after resuming from the step-2 checkpoint
    resumed.finish()

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert all("step" in r for r in records)
    assert [r["step"] for r in records if "critic/score/mean" in r] == [1, 2, 3, 4]  # one history
    assert records[0]["critic/score/mean"] == pytest.approx(0.1)  # tensors and numpy scalars became numbers
    assert read_metrics(tmp_path / "metrics.jsonl") == records
    assert _is_png(tmp_path / "reward_curve.png")


def test_console_backend_writes_one_line_per_log(tmp_path, capsys):
    tracker = Tracking("colorl", "t", ["console"], config={}, local_dir=str(tmp_path), total_steps=2)
    _log_steps(tracker, range(1, 3))
    tracker.finish()
    out = capsys.readouterr().out
    assert "step 1 | score 0.1 | pg_loss -0.5 | 0.25s/step" in out
    assert "val[colorl/reverse] 0.4" in out
    assert not (tmp_path / "metrics.jsonl").exists()
    assert _is_png(tmp_path / "reward_curve.png")  # plotted from the in-memory history


def test_unknown_backend_lists_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="console, wandb, file"):
        Tracking("colorl", "t", ["tensorboard"], config={}, local_dir=str(tmp_path))


def test_plot_keeps_the_latest_value_of_a_repeated_step(tmp_path):
    path = tmp_path / "curve.png"
    assert not plot_reward_curve([{"step": 1, "actor/pg_loss": 0.1}], path)  # nothing to plot, no file
    assert not path.exists()
    assert plot_reward_curve([{"step": 1, "critic/score/mean": 0.1}, {"step": 1, "critic/score/mean": 0.3}], path)
    assert _is_png(path)


def test_wandb_backend_writes_an_offline_run_under_local_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # default must be offline
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = Tracking(
        "colorl", "t", ["wandb"], config={"data": {"train_batch_size": 16}}, local_dir=str(tmp_path), total_steps=3
    )
    _log_steps(tracker, range(1, 3))
    tracker.finish()

    records = wandb_records(run_file(tmp_path, tracker.wandb_run_id))
    rows = history(records)
    assert [(h["_step"], h["critic/score/mean"]) for h in rows] == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2))]
    assert rows[-1][VAL_KEY] == pytest.approx(0.4)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.run_id == tracker.wandb_run_id
    assert any(item.key == "data" and "train_batch_size" in item.value_json for item in run.config.update)

    resumed = Tracking("colorl", "t", ["wandb"], config={}, local_dir=str(tmp_path), resume_id=tracker.wandb_run_id)
    resumed.log({"critic/score/mean": 0.3}, step=3)
    resumed.finish()
    assert resumed.wandb_run_id == tracker.wandb_run_id
