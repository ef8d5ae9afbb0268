"""Reward managers by name (``reward.reward_manager.name``, verl's registry): what turns a rollout batch into
token-level scores. ``register`` adds one; ``make_reward_manager`` builds the configured one for a run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from config import ConfigError
from data.reward import ComputeScore, DAPORewardManager, RewardManager

REWARD_MANAGERS: dict[str, type[RewardManager]] = {}


def register(name: str) -> Callable[[type[RewardManager]], type[RewardManager]]:
    """Decorator: make a ``RewardManager`` subclass available as ``reward.reward_manager.name=<name>``."""

    def add(cls: type[RewardManager]) -> type[RewardManager]:
        if REWARD_MANAGERS.get(name, cls) is not cls:
            raise ValueError(f"reward manager {name!r} is already registered as {REWARD_MANAGERS[name].__name__}")
        REWARD_MANAGERS[name] = cls
        return cls

    return add


register("naive")(RewardManager)
register("dapo")(DAPORewardManager)


def make_reward_manager(cfg: Any, tokenizer: Any, compute_score: ComputeScore | None) -> RewardManager:
    """The manager ``cfg.reward.reward_manager.name`` names, with its ``reward.reward_kwargs``; ``ConfigError``
    for an unknown name or arguments it cannot use (checked before any model loads)."""
    name, kwargs = cfg.reward.reward_manager.name, cfg.reward.reward_kwargs
    if name not in REWARD_MANAGERS:
        raise ConfigError.invalid("reward.reward_manager.name", name, f"must be one of {', '.join(REWARD_MANAGERS)}")
    cls = REWARD_MANAGERS[name]
    buffer = kwargs.overlong_buffer_cfg
    if buffer.enable and cls is not DAPORewardManager:
        raise ConfigError.invalid(
            "reward.reward_kwargs.overlong_buffer_cfg.enable",
            True,
            f"the overlong penalty is the dapo reward manager's; set reward.reward_manager.name=dapo (not {name})",
        )
    common = {"compute_score": compute_score, "reward_fn_key": cfg.data.reward_fn_key}
    if cls is not DAPORewardManager:
        return cls(tokenizer, **common)
    max_resp_len = kwargs.max_resp_len or cfg.data.max_response_length
    if buffer.enable and buffer.len > max_resp_len:
        raise ConfigError.invalid(
            "reward.reward_kwargs.overlong_buffer_cfg.len",
            buffer.len,
            f"must not exceed max_resp_len={max_resp_len} (reward.reward_kwargs.max_resp_len, null: "
            "data.max_response_length)",
        )
    return cls(tokenizer, **common, overlong_buffer_cfg=buffer, max_resp_len=max_resp_len)
