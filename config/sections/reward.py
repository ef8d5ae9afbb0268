"""Rewards: the ``reward`` section.

``reward.custom_reward_function`` is a user's ``compute_score``, ``reward.reward_manager`` how it is called
(``data.reward_loop.REWARD_MANAGERS``), ``reward.reward_model`` a learned reward model colocated with the other roles
(its score is added to the rule-based reward). ColoRL reads ``reward`` only; a command-line dialect's older
spellings move into it before the config is built (``config.adapter``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from config.checks import ConfigError, check, is_int, non_negative, positive_int
from config.sections.engine import RefFSDPConfig


@dataclass(frozen=True)
class CustomRewardFunctionConfig:
    """A user's ``compute_score(data_source, solution_str, ground_truth, extra_info)`` in a Python file.

    A null path keeps the built-in rule-based rewards, picked by each row's data source.
    """

    path: str | None = None
    name: str = "compute_score"

    def __post_init__(self) -> None:
        check(
            self,
            ["path"],
            lambda v: v is None or (isinstance(v, str) and v.strip() != ""),
            "must be null (built-in rewards) or the path of a Python file",
        )
        check(self, ["name"], lambda v: isinstance(v, str) and v.isidentifier(), "must be a Python function name")


@dataclass(frozen=True)
class ModuleConfig:
    path: str | None = None
    name: str = "custom_reward_manager"


@dataclass(frozen=True)
class RewardManagerConfig:
    """Which reward manager scores a batch: ``source=register`` picks ``name`` among ColoRL's
    (``data.reward_loop.REWARD_MANAGERS``: naive, batch, dapo, prime, gdpo, rate_limited, remote); ``importlib``
    builds the user's reward-manager class ``name`` from ``module.path`` (``data.reward_loop``,
    ``ImportedRewardManager``)."""

    source: Literal["register", "importlib"] = "register"
    name: str = "naive"
    module: ModuleConfig = field(default_factory=ModuleConfig)

    def __post_init__(self) -> None:
        if self.source == "importlib" and not self.module.path:
            raise ConfigError.invalid(
                "module.path",
                self.module.path,
                "must name the Python file (or pkg://package.module) of the reward-manager class "
                f"{self.name!r} when source=importlib",
            )


@dataclass(frozen=True)
class RewardModelConfig:
    """A learned reward model (an HF sequence-classification checkpoint, one score per sequence), colocated with
    the other roles; its score is added to the rule-based reward. It reads the policy's token ids as they are, so
    it must share the policy's tokenizer."""

    enable: bool = False
    model_path: str | None = None
    micro_batch_size_per_gpu: int = 16  # ColoRL: sequences per reward-model forward on one worker
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)  # ColoRL: how the reward model is sharded

    def __post_init__(self) -> None:
        positive_int(self, "micro_batch_size_per_gpu")
        if self.enable and not self.model_path:
            raise ConfigError.invalid(
                "model_path", self.model_path, "must name a sequence-classification checkpoint when enable=true"
            )


@dataclass(frozen=True)
class OverlongBufferConfig:
    """``reward.reward_kwargs.overlong_buffer_cfg``: DAPO's soft length penalty (the dapo reward manager's). A
    response of L tokens, past ``max_resp_len - len`` by e = L − (max_resp_len − len) tokens, gets
    min(−e / len · penalty_factor, 0) added to its score: 0 up to the buffer, falling linearly to −penalty_factor at
    the limit. ``log`` records each response's ``overlong_reward`` and ``overlong`` (whether it was penalised)."""

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
    """``reward.reward_kwargs``: the reward manager's own keyword arguments (scripts add them with ``+``);
    a manager gets those set away from their defaults (``trainer.running.build.make_reward_manager``)."""

    overlong_buffer_cfg: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)  # dapo
    max_resp_len: int | None = None  # dapo; null: data.max_response_length

    def __post_init__(self) -> None:
        check(self, ["max_resp_len"], lambda v: v is None or (is_int(v) and v > 0), "must be null or positive")


@dataclass(frozen=True)
class RewardConfig:
    num_workers: int = 8  # the remote reward manager's Ray workers (calls at a time)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    reward_manager: RewardManagerConfig = field(default_factory=RewardManagerConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    reward_kwargs: RewardKwargsConfig = field(default_factory=RewardKwargsConfig)
    # the rate_limited (and, but max_concurrent, remote) reward manager's; scripts add them with +
    max_concurrent: int = 1  # calls at a time
    max_rpm: int | None = None  # requests a minute (null: no limit)
    max_tpm: int | None = None  # tokens a minute, each request counted as estimated_tokens_per_request
    estimated_tokens_per_request: int = 2000
    timeout: float = 300.0  # seconds before a call scores 0 (reward/errors/timeout)

    def __post_init__(self) -> None:
        positive_int(self, "num_workers")
        positive_int(self, "max_concurrent")
        positive_int(self, "estimated_tokens_per_request")
        check(self, ["max_rpm"], lambda v: v is None or (is_int(v) and v > 0), "must be null or positive")
        check(self, ["max_tpm"], lambda v: v is None or (is_int(v) and v > 0), "must be null or positive")
        check(
            self, ["timeout"], lambda v: isinstance(v, (int, float)) and v > 0, "must be a positive number of seconds"
        )
        if self.reward_kwargs.overlong_buffer_cfg.enable and self.reward_manager.name != "dapo":
            raise ConfigError.invalid(
                "reward_kwargs.overlong_buffer_cfg.enable",
                True,
                "the overlong penalty is the dapo reward manager's; set reward.reward_manager.name=dapo "
                f"(not {self.reward_manager.name})",
            )
