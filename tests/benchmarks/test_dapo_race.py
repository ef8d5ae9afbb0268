"""benchmarks.dapo_race: the numbers it reads from a run's metrics, and (slow) the whole race on the tiny demo."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.dapo_race import strict_curve, summary
from data.builtin import prepare_builtin

REPO = Path(__file__).resolve().parent.parent.parent
SOURCE = "colorl/arith"


def row(step, minute, **metrics):
    return {"step": step, "_minute": minute, **metrics}


def test_strict_accuracy_is_the_validation_reward_less_the_overlong_penalty():
    rows = [
        row(0, 0.5, **{f"val-core/{SOURCE}/reward/mean@1": 0.2}),
        row(1, 1.0, **{"timing_s/step": 8.0}),
        row(2, 2.5, **{f"val-core/{SOURCE}/reward/mean@1": 0.3, f"val-aux/{SOURCE}/overlong_reward/mean@1": -0.1}),
    ]
    assert strict_curve(rows) == [{"minute": 0.5, "step": 0, "strict": 0.2}, {"minute": 2.5, "step": 2, "strict": 0.4}]


def test_summary_counts_signal_generation_batches_and_seconds_per_prompt():
    steps = [
        row(1, 1.0, **{"timing_s/step": 16.0, "health/frac_reward_zero_std": 0.5}),  # plain: trained = generated
        row(
            2,
            2.0,
            **{"timing_s/step": 24.0, "health/frac_reward_zero_std": 0.75, "train/num_gen_batches": 3.0}
            | {"training/filter_groups/frac_reward_zero_std": 0.0},
        ),
    ]
    curve = [{"minute": 0.5, "step": 0, "strict": 0.1}, {"minute": 2.5, "step": 2, "strict": 0.5}]
    out = summary(steps, curve, train_batch_size=8, gain=0.3)
    assert out["trained_groups_with_signal"] == [0.5, 1.0] and out["generated_groups_with_signal_mean"] == 0.375
    assert out["gen_batches_per_step_mean"] == 2.0 and out["s_per_trained_prompt_mean"] == 2.5
    assert out["strict_gain_per_minute"] == 0.2 and out["first_minute_at_gain"] == 2.5 and out["steps"] == 2


@pytest.mark.slow
def test_the_race_runs_both_presets_on_the_tiny_demo(tmp_path):
    assets = prepare_builtin(tmp_path / "assets", num_train=32, num_val=4, sft_warmup_steps=0, hidden_size=32)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.parquet").symlink_to(assets["train_files"])
    (data / "test.parquet").symlink_to(assets["val_files"])
    tiny = ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "data.max_response_length=4"]
    tiny += ["trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.n_gpus_per_node=2"]
    tiny += ["actor_rollout_ref.rollout.n=2", "data.val_max_samples=-1"]
    command = [
        sys.executable,
        "-m",
        "benchmarks.dapo_race",
        "--model-path",
        assets["model_path"],
        "--data-dir",
        str(data),
    ]
    command += ["--plain", "demo", "--dapo", "demo", "--minutes", "5"] + [f"--set={o}" for o in tiny]
    command += ["--dapo-set=algorithm.filter_groups.enable=true", "--dapo-set=data.gen_batch_size=2"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert out["plain"]["steps"] == out["dapo"]["steps"] == 2
    assert out["plain"]["gen_batches_per_step_mean"] == 1.0 and out["dapo"]["gen_batches_per_step_mean"] >= 2.0
    assert out["dapo"]["trained_groups_with_signal_mean"] == 1.0 and len(out["dapo"]["curve"]) == 2
