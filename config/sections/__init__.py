"""verl's schema sections, one module each: model, engine (optimizer, FSDP), actor, rollout, reference, critic, rewards.

One frozen dataclass per component is the single home of its defaults (``config.schema`` holds the rest and the
root); verl's subtrees of machinery ColoRL does not have are ``config.tree.InertTree``s. Choices are ``Literal``
types, checked when the config is built (``config.load``); ranges are checked in ``__post_init__``. Key names
and defaults are verl 0.9.1's; what ColoRL does with the keys it cannot honour is said in ``cli.inert``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from config.checks import ConfigError
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
    hybrid_engine: bool = True  # ColoRL's roles always share one process per device
    nccl_timeout: int = 600

    def __post_init__(self) -> None:
        # a LoRA actor trains fp32 adapters over a frozen base, which verl's model_dtype may hold in bf16 (it is
        # the compute dtype then, cli.normalize); a fully trained actor keeps fp32 masters
        dtype = self.actor.fsdp_config.model_dtype
        if dtype not in ("fp32", "float32") and self.model.lora_rank == 0:
            raise ConfigError.invalid(
                "actor.fsdp_config.model_dtype",
                dtype,
                "a trained role keeps fp32 master weights; fsdp_config.dtype (mixed_precision.param_dtype) sets "
                "the compute dtype",
            )


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
