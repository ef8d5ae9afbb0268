"""DAPO's keys: dynamic sampling (``algorithm.filter_groups``) and the dapo reward manager's overlong penalty
(``reward.reward_manager.name=dapo`` with ``reward.reward_kwargs``).

Names, defaults and meaning are verl's (``FilterGroupsConfig`` in verl 0.9.1's ``trainer/config/algorithm.py``,
the dapo reward manager's ``overlong_buffer_cfg``). ``data.gen_batch_size`` (``config.schema.DataConfig``) sizes
the generation batches that dynamic sampling draws until ``data.train_batch_size`` prompts have signal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from config.checks import ConfigError, check, is_int, non_negative

# metrics computed from the batch's tensors; any other name is a value the reward function returns per response
# ("acc" falls back to the score when the function returns a plain number, as verl's dapo reward manager records)
TENSOR_METRICS = ("reward", "seq_reward", "seq_final_reward")


@dataclass(frozen=True)
class FilterGroupsConfig:
    """``algorithm.filter_groups``: keep only prompt groups whose ``metric`` differs between their responses.

    A group whose responses all score the same gives GRPO-style estimators zero advantage: it trains nothing.
    With ``enable``, generation repeats in batches of ``data.gen_batch_size`` prompts until
    ``data.train_batch_size`` groups with signal are collected, at most ``max_num_gen_batches`` batches a step
    (0: no limit), and the step trains on exactly ``data.train_batch_size`` of them (the surplus is dropped).
    ``metric``: ``reward``/``seq_reward`` (a response's summed score), ``seq_final_reward`` (its summed reward
    after the in-reward KL), or a value the reward function returns (``acc``, ``score``, ...).
    """

    enable: bool = False
    metric: str = "reward"
    max_num_gen_batches: int = 0
    max_inflight_gen_batches: int = 1  # verl's asynchronous sampler's; ColoRL generates one batch at a time

    def __post_init__(self) -> None:
        check(self, ["metric"], lambda v: isinstance(v, str) and v != "", "must name a metric (acc, score, ...)")
        check(self, ["max_num_gen_batches"], is_int, "must be an integer (0 or less: no limit)")
        check(self, ["max_inflight_gen_batches"], lambda v: is_int(v) and v > 0, "must be a positive integer")


@dataclass(frozen=True)
class OverlongBufferConfig:
    """``reward.reward_kwargs.overlong_buffer_cfg``: DAPO's soft length penalty. A response of L tokens, past
    ``max_resp_len - len`` by e = L − (max_resp_len − len) tokens, gets min(−e / len · penalty_factor, 0) added to
    its score: 0 up to the buffer, falling linearly to −penalty_factor at the limit. ``log`` records each response's
    ``overlong_reward`` and ``overlong`` (whether it was penalised) beside its score."""

    enable: bool = False
    len: int = 0
    penalty_factor: float = 1.0
    log: bool = False

    def __post_init__(self) -> None:
        check(self, ["len"], lambda v: is_int(v) and v >= 0, "must be a non-negative number of tokens")
        non_negative(self, "penalty_factor")
        if self.enable and self.len <= 0:
            raise ConfigError.invalid(
                "len", self.len, "must be positive when enable=true (tokens before the limit where the penalty starts)"
            )


@dataclass(frozen=True)
class RewardKwargsConfig:
    """``reward.reward_kwargs``: the reward manager's own arguments (the dapo manager's)."""

    overlong_buffer_cfg: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    max_resp_len: int | None = None  # null: data.max_response_length

    def __post_init__(self) -> None:
        check(self, ["max_resp_len"], lambda v: v is None or (is_int(v) and v > 0), "must be null or positive")


@dataclass(frozen=True)
class RewardManagerConfig:
    """``reward.reward_manager``: which manager turns responses into scores (``data.reward_managers``)."""

    source: Literal["register"] = "register"
    name: str = "naive"


@dataclass(frozen=True)
class RewardConfig:
    """``reward.*``: the reward manager and its arguments."""

    reward_manager: RewardManagerConfig = field(default_factory=RewardManagerConfig)
    reward_kwargs: RewardKwargsConfig = field(default_factory=RewardKwargsConfig)
