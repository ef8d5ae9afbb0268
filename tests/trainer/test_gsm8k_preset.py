"""The GPU recipe conf/qwen2_5_0_5b_gsm8k.yaml, checked on CPU without a run: verl's quickstart hyper-parameters,
valid batch arithmetic on 2, 4 and 8 workers, and one-line errors from ``python main.py --config-name ...``."""

import dataclasses
import os
import subprocess
import sys
from functools import reduce
from pathlib import Path

import pytest

from config import ConfigError, split_command_line
from planner import load_config, load_with_plan, make_plan, num_workers, uses_critic

PRESET = "qwen2_5_0_5b_gsm8k"
REPO = Path(__file__).resolve().parent.parent.parent

# verl's docs/start/quickstart.rst (PPO on GSM8K, Qwen2.5-0.5B-Instruct), and verl defaults it relies on.
QUICKSTART = {
    "data.train_batch_size": 256,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 64,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 8,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
    "critic.optim.lr": 1e-5,
    "critic.ppo_micro_batch_size_per_gpu": 4,
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "trainer.val_before_train": False,
    "trainer.save_freq": 10,
    "trainer.test_freq": 10,
    "trainer.total_epochs": 15,
    "trainer.total_training_steps": None,
    "trainer.device": "cuda",
    # verl's defaults under the quickstart: PPO with GAE and one response per prompt
    "algorithm.adv_estimator": "gae",
    "actor_rollout_ref.rollout.n": 1,
    "critic.ppo_mini_batch_size": 64,
    "critic.forward_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.actor.optim.weight_decay": 0.01,
    "actor_rollout_ref.actor.clip_ratio": 0.2,
    "critic.cliprange_value": 0.5,
}


def test_preset_has_the_quickstart_hyper_parameters(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config([], config_name=PRESET)
    assert {key: reduce(getattr, key.split("."), cfg) for key in QUICKSTART} == QUICKSTART
    assert uses_critic(cfg) and cfg.critic.model.path is None  # the critic starts from the actor's weights
    assert cfg.data.train_files == f"{tmp_path}/data/gsm8k/train.parquet"  # where data.preprocess.gsm8k writes
    assert cfg.data.val_files == f"{tmp_path}/data/gsm8k/test.parquet"
    assert cfg.actor_rollout_ref.model.path == f"{tmp_path}/models/Qwen2.5-0.5B-Instruct"  # local, not a hub id
    assert cfg.reward.custom_reward_function.path is None  # GSM8K's reward comes from its data source


@pytest.mark.parametrize("n_gpus", [2, 4, 8])
def test_preset_batches_divide_over_2_4_8_gpus(n_gpus):
    cfg = load_config([f"trainer.n_gpus_per_node={n_gpus}"], config_name=PRESET)
    assert num_workers(cfg) == n_gpus
    per_gpu_mini = make_plan(cfg, n_gpus).actor_mini_batch_size
    assert per_gpu_mini == cfg.actor_rollout_ref.actor.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n // n_gpus
    assert per_gpu_mini % cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 0


def test_preset_rejects_a_gpu_count_that_does_not_divide():
    with pytest.raises(ConfigError, match="256 sequences per step cannot be split evenly across 3 workers"):
        load_config(["trainer.n_gpus_per_node=3"], config_name=PRESET)


def test_config_name_reaches_the_early_check():
    config_name, overrides, hydra_app = split_command_line(["--config-name", PRESET, "data.train_batch_size=100"])
    assert (config_name, overrides, hydra_app) == (PRESET, ["data.train_batch_size=100"], False)
    with pytest.raises(ConfigError, match="data.train_batch_size=100.* 8 workers"):
        load_with_plan(overrides, config_name)
    valid = split_command_line(["-cn", PRESET, "trainer.n_gpus_per_node=4"])
    assert valid == (PRESET, ["trainer.n_gpus_per_node=4"], False)
    _, plan = load_with_plan(["trainer.n_gpus_per_node=4"], PRESET)
    assert plan.n_workers == 4  # the plan that checked the config comes with it


def test_hydra_flags_go_to_hydras_application():
    assert split_command_line(["--cfg", "job"]) == ("demo", ["--cfg", "job"], True)
    assert split_command_line(["hydra.job.chdir=true"])[2]
    assert split_command_line(["actor_rollout_ref.model.path=/m"])[:2] == (
        "ppo_trainer",
        ["actor_rollout_ref.model.path=/m"],
    )


def test_cli_without_the_model_is_one_line(tmp_path):
    """Hydra composes the preset itself; the missing local model is reported before Ray or any download."""
    env = {**os.environ, "HOME": str(tmp_path), "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "main.py"),
            "--config-name",
            PRESET,
            "trainer.device=cpu",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("colorl: config error: actor_rollout_ref.model.path=")
    assert f"{tmp_path}/models/Qwen2.5-0.5B-Instruct" in result.stderr and "no such directory" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_custom_reward_function_keys():
    """Their defaults and their checks (verl's older top-level place: tests/verl_compat/cli/test_verl_spellings.py)."""
    cfg = load_config([])
    assert dataclasses.asdict(cfg.reward.custom_reward_function) == {"path": None, "name": "compute_score"}
    with pytest.raises(ConfigError, match=r"^reward\.custom_reward_function\.name='1x': must be a Python function"):
        load_config(["reward.custom_reward_function.name=1x"])
    with pytest.raises(ConfigError, match=r"^reward\.custom_reward_function\.path='': must be null"):
        load_config(["reward.custom_reward_function.path=''"])
