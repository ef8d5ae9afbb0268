"""The value model: the ``critic`` section, trained beside the policy when the advantage
estimator reads values (``critic.enable=null``) or when asked to."""

from __future__ import annotations

from dataclasses import dataclass, field

from config.checks import optional_positive_int, positive, positive_int
from config.sections.actor import LossAggMode
from config.sections.engine import FSDPConfig, OptimConfig
from config.sections.model import CriticModelConfig


@dataclass(frozen=True)
class CriticConfig:
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)  # how the critic is sharded
    rollout_n: int = "${actor_rollout_ref.rollout.n}"  # type: ignore[assignment]
    enable: bool | None = None  # null -> used iff the advantage estimator needs values (gae)
    ppo_mini_batch_size: int = "${actor_rollout_ref.actor.ppo_mini_batch_size}"  # type: ignore[assignment]
    ppo_micro_batch_size_per_gpu: int | None = None
    use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    ppo_max_token_len_per_gpu: int = 32768  # no vocabulary logits, so twice the actor's budget fits
    forward_max_token_len_per_gpu: int = "${critic.ppo_max_token_len_per_gpu}"  # type: ignore[assignment]
    ppo_epochs: int = "${actor_rollout_ref.actor.ppo_epochs}"  # type: ignore[assignment]
    shuffle: bool = "${actor_rollout_ref.actor.shuffle}"  # type: ignore[assignment]
    cliprange_value: float = 0.5
    loss_agg_mode: LossAggMode = "${actor_rollout_ref.actor.loss_agg_mode}"  # type: ignore[assignment]
    loss_scale_factor: float | None = "${actor_rollout_ref.actor.loss_scale_factor}"  # type: ignore[assignment]
    forward_micro_batch_size_per_gpu: int | None = "${critic.ppo_micro_batch_size_per_gpu}"  # type: ignore
    grad_clip: float = 1.0  # the gradient-norm clip
    model: CriticModelConfig = field(default_factory=CriticModelConfig)

    def __post_init__(self) -> None:
        positive_int(
            self,
            "ppo_mini_batch_size",
            "ppo_epochs",
            "rollout_n",
            "ppo_max_token_len_per_gpu",
            "forward_max_token_len_per_gpu",
        )
        optional_positive_int(
            self,
            "ppo_micro_batch_size_per_gpu",
            "forward_micro_batch_size_per_gpu",
        )
        positive(self, "cliprange_value", "grad_clip")
