"""verl's older places of the core's keys: each loads into the core's place, where the core's checks apply to it
(the core's keys themselves: tests/trainer/test_gsm8k_preset.py, tests/trainer/test_config.py)."""

import dataclasses

import pytest

from verl_compat.cli import ConfigError, load_config


def test_the_older_top_level_custom_reward_function_moves_into_reward_and_is_checked_there():
    cfg = load_config([])
    assert dataclasses.asdict(cfg.custom_reward_function) == {"path": None, "name": None}  # verl's older place
    with pytest.raises(ConfigError, match=r"^reward\.custom_reward_function\.name='1x': must be a Python function"):
        load_config(["custom_reward_function.name=1x"])
    with pytest.raises(ConfigError, match=r"^reward\.custom_reward_function\.path='': must be null"):
        load_config(["custom_reward_function.path=''"])
    assert load_config(["custom_reward_function.path=/r.py"]).reward.custom_reward_function.path == "/r.py"


def test_the_critics_older_fsdp_config_is_its_fsdp_section():
    cfg = load_config(["critic.fsdp_config.wrap_policy.min_num_params=0"])
    assert cfg.critic.fsdp.wrap_policy.min_num_params == 0
