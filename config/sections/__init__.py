"""The worker roles' schema sections, one module each: model, engine (optimizer, FSDP), actor, rollout, reference,
critic, rewards.

One frozen dataclass per component is the single home of its defaults (``config.schema`` holds the rest and the
root); each declares the keys ColoRL reads, with their defaults. Choices are ``Literal`` types, checked when the
config is built (``config.load``); ranges are checked in ``__post_init__``. A command-line dialect's further keys
are its own schema's (``config.adapter.Adapter.schema``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from config.sections.actor import (
    ActorConfig,
    KLLossType,
    LossAggMode,
    PolicyLossConfig,
    PolicyLossMode,
    RefConfig,
    RolloutCorrectionConfig,
)
from config.sections.critic import CriticConfig
from config.sections.engine import (
    FSDPConfig,
    MixedPrecisionConfig,
    OptimConfig,
    ParamDtype,
    ReduceDtype,
    RefFSDPConfig,
    WrapPolicyConfig,
)
from config.sections.model import CriticModelConfig, ModelConfig
from config.sections.reward import CustomRewardFunctionConfig, RewardConfig, RewardModelConfig
from config.sections.rollout import AgentLoopConfig, MultiTurnConfig, RolloutConfig, ValKwargs


@dataclass(frozen=True)
class ActorRolloutRefConfig:
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    model: ModelConfig = field(default_factory=ModelConfig)


__all__ = [
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AgentLoopConfig",
    "CriticConfig",
    "CriticModelConfig",
    "CustomRewardFunctionConfig",
    "FSDPConfig",
    "KLLossType",
    "LossAggMode",
    "MixedPrecisionConfig",
    "ModelConfig",
    "MultiTurnConfig",
    "OptimConfig",
    "ParamDtype",
    "PolicyLossConfig",
    "PolicyLossMode",
    "ReduceDtype",
    "RefConfig",
    "RefFSDPConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "ValKwargs",
    "WrapPolicyConfig",
]
