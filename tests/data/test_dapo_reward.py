"""The dapo reward manager's overlong penalty (``reward.reward_kwargs.overlong_buffer_cfg``) and the registry."""

import pytest

from config import ConfigError
from config.sections.reward import OverlongBufferConfig
from data.reward import DAPORewardManager, RewardManager, overlong_penalty
from data.reward_loop import REWARD_MANAGERS
from planner import load_config
from tests.data.test_data_reward import _batch
from trainer.running.build import make_reward_manager


def constant(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 1.0, "acc": 1.0}


@pytest.mark.parametrize("length", range(0, 11))
def test_the_penalty_is_zero_before_the_buffer_and_linear_to_the_limit(length):
    # max_resp_len 10, buffer 4: no penalty up to 6 tokens, then -factor·(L - 6)/4, -factor at 10 tokens
    expected = 0.0 if length <= 6 else -0.5 * (length - 6) / 4
    assert overlong_penalty(length, max_resp_len=10, buffer_len=4, penalty_factor=0.5) == pytest.approx(expected)


def test_dapo_manager_adds_the_penalty_to_the_score_on_the_last_token(char_tokenizer):
    buffer = OverlongBufferConfig(enable=True, len=2, penalty_factor=1.0, log=True)
    manager = DAPORewardManager(char_tokenizer, compute_score=constant, overlong_buffer_cfg=buffer, max_resp_len=6)
    # lengths 3, 5, 6 (valid tokens): 4 is where the buffer starts
    reward, extras = manager(_batch(char_tokenizer, ["12$", "1234$", "123456"], ["1", "1", "1"]))
    assert reward.sum(-1).tolist() == pytest.approx([1.0, 0.5, 0.0])
    assert reward[1, 4].item() == pytest.approx(0.5) and reward[2, 5].item() == pytest.approx(0.0)
    assert extras["overlong_reward"] == pytest.approx([0.0, -0.5, -1.0])
    assert extras["overlong"] == [False, True, True]
    # the function's own values stay as it gave them: the filter's acc/score metrics read the unshaped score
    assert extras["acc"] == [1.0, 1.0, 1.0] and extras["score"] == [1.0, 1.0, 1.0]


def test_without_log_or_enable_the_manager_is_the_naive_one(char_tokenizer):
    data = _batch(char_tokenizer, ["12$", "123456"], ["1", "1"])
    naive = RewardManager(char_tokenizer, compute_score=constant)(data)
    quiet = OverlongBufferConfig(enable=True, len=2, penalty_factor=1.0, log=False)
    shaped, extras = DAPORewardManager(
        char_tokenizer, compute_score=constant, overlong_buffer_cfg=quiet, max_resp_len=6
    )(data)
    assert "overlong_reward" not in extras and shaped.sum().item() == pytest.approx(1.0)
    off = DAPORewardManager(char_tokenizer, compute_score=constant, overlong_buffer_cfg=OverlongBufferConfig())
    assert off(data)[0].tolist() == naive[0].tolist()


def test_config_picks_the_manager_and_checks_its_arguments(char_tokenizer):
    assert {"naive", "dapo"} <= set(REWARD_MANAGERS)
    verl_style = [
        "reward.reward_manager.name=dapo",
        "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",  # verl's scripts add these keys with '+'
        "+reward.reward_kwargs.overlong_buffer_cfg.len=4",
        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
        "data.max_response_length=8",
    ]
    manager = make_reward_manager(load_config(verl_style), char_tokenizer, None)
    assert isinstance(manager, DAPORewardManager) and manager.max_resp_len == 8  # null: data.max_response_length
    assert manager.overlong.len == 4 and manager.overlong.penalty_factor == 0.5
    # the arguments are checked when the config loads (a dry run or a test catches them before any model loads)
    with pytest.raises(ConfigError, match=r"reward\.reward_kwargs\.overlong_buffer_cfg\.len=4: must not exceed"):
        load_config([*verl_style, "data.max_response_length=3"])
    with pytest.raises(ConfigError, match=r"overlong_buffer_cfg\.enable=True: .*reward_manager\.name=dapo"):
        load_config(verl_style[1:])
    with pytest.raises(ConfigError, match=r"overlong_buffer_cfg\.len=0: must be positive when enable=true"):
        load_config(["reward.reward_kwargs.overlong_buffer_cfg.enable=true", "reward.reward_manager.name=dapo"])
    with pytest.raises(
        ConfigError, match=r"reward\.reward_manager\.name='nope': must be one of naive, prime, batch, dapo"
    ):
        make_reward_manager(load_config(["reward.reward_manager.name=nope"]), char_tokenizer, None)
    # a manager that takes no such argument: one line naming the key
    with pytest.raises(ConfigError, match=r"reward\.reward_kwargs\.max_resp_len=8: the naive reward manager takes no"):
        make_reward_manager(load_config(["reward.reward_kwargs.max_resp_len=8"]), char_tokenizer, None)
