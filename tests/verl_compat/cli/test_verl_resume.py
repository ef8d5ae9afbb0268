"""A checkpoint whose config record has keys at verl's older places resumes: each is compared at its current place
(``VerlAdapter.current_place``), so only a changed value blocks the resume (the fingerprint itself:
tests/reliability/test_run_dir.py)."""

import pytest

from config import ConfigError, replace_keys
from trainer.state.fingerprint import check_resume, config_record
from verl_compat.cli import load_config


def _older(record: dict, new_keys: tuple[str, ...]) -> dict:
    """``record`` as a checkpoint saved before the schema had ``new_keys`` and before the reward, Ray and critic
    sections moved to verl 0.9.1's places recorded it."""
    older = {}
    for key, value in record.items():
        if key.startswith(new_keys) or key.startswith(("reward.", "custom_reward_function.", "reward_model.")):
            continue
        older[key.replace("ray_kwargs.ray_init.", "ray_init.").replace("critic.fsdp.", "critic.fsdp_config.")] = value
    older |= {
        "custom_reward_function.path": record["reward.custom_reward_function.path"],
        "custom_reward_function.name": record["reward.custom_reward_function.name"],
        "reward_model.enable": record["reward.reward_model.enable"],
        "reward_model.model.path": record["reward.reward_model.model_path"],
    }
    return older


def test_a_checkpoint_saved_before_keys_were_added_or_moved_resumes(tmp_path):
    """Keys new in the schema at their default, and keys recorded under their older places, do not block a resume;
    a new key set away from its default, or a moved key's changed value, does."""
    saved = load_config(["trainer.total_training_steps=4"])
    new_keys = ("algorithm.filter_groups.", "data.gen_batch_size", "distillation.", "global_profiler.")
    older = _older(config_record(saved), new_keys)
    assert "ray_init.num_cpus" in older and "algorithm.filter_groups.enable" not in older
    assert check_resume(older, saved, tmp_path) == []
    filtering = replace_keys(saved, {"algorithm.filter_groups.enable": True})
    with pytest.raises(ConfigError, match=r"algorithm\.filter_groups\.enable <not recorded> -> True"):
        check_resume(older, filtering, tmp_path)
    other_function = replace_keys(saved, {"reward.custom_reward_function.name": "other"})
    with pytest.raises(ConfigError, match=r"reward\.custom_reward_function\.name 'compute_score' -> 'other'"):
        check_resume(older, other_function, tmp_path)
