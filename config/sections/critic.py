"""The value model: verl's ``critic`` section (``FSDPCriticConfig``), trained beside the policy when the advantage
estimator reads values (``critic.enable=null``) or when asked to."""

from __future__ import annotations

from dataclasses import dataclass, field

from config.checks import optional_positive_int, positive, positive_int
from config.sections.actor import LossAggMode
from config.sections.engine import CriticCheckpointTree, FSDPConfig, OptimConfig, Strategy
from config.sections.model import CriticModelConfig
from config.sections.profiler import ProfilerTree


@dataclass(frozen=True)
class CriticConfig:
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)  # verl's older critic.model.fsdp_config (an alias)
    _target_: str = "verl.workers.config.FSDPCriticConfig"
    rollout_n: int = "${actor_rollout_ref.rollout.n}"  # type: ignore[assignment]
    strategy: Strategy = "fsdp"
    enable: bool | None = None  # null -> used iff the advantage estimator needs values (gae)
    ppo_mini_batch_size: int = "${actor_rollout_ref.actor.ppo_mini_batch_size}"  # type: ignore[assignment]
    ppo_micro_batch_size: int | None = None  # verl's global micro-batch: ÷ workers -> the per-GPU key
    ppo_micro_batch_size_per_gpu: int | None = None
    use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    ppo_max_token_len_per_gpu: int = 32768  # no vocabulary logits, so twice the actor's budget fits
    forward_max_token_len_per_gpu: int = "${critic.ppo_max_token_len_per_gpu}"  # type: ignore[assignment]
    ppo_epochs: int = "${actor_rollout_ref.actor.ppo_epochs}"  # type: ignore[assignment]
    shuffle: bool = "${actor_rollout_ref.actor.shuffle}"  # type: ignore[assignment]
    data_loader_seed: int = 42
    cliprange_value: float = 0.5
    loss_agg_mode: LossAggMode = "${actor_rollout_ref.actor.loss_agg_mode}"  # type: ignore[assignment]
    loss_scale_factor: float | None = "${actor_rollout_ref.actor.loss_scale_factor}"  # type: ignore[assignment]
    checkpoint: CriticCheckpointTree = field(default_factory=CriticCheckpointTree.default)
    profiler: ProfilerTree = field(default_factory=ProfilerTree.default)
    forward_micro_batch_size: int | None = "${critic.ppo_micro_batch_size}"  # type: ignore[assignment]
    forward_micro_batch_size_per_gpu: int | None = "${critic.ppo_micro_batch_size_per_gpu}"  # type: ignore
    ulysses_sequence_parallel_size: int = 1
    grad_clip: float = 1.0  # verl's critic key; optim.clip_grad is the same (cli.normalize)
    model: CriticModelConfig = field(default_factory=CriticModelConfig)

    def __post_init__(self) -> None:
        positive_int(
            self,
            "ppo_mini_batch_size",
            "ppo_epochs",
            "rollout_n",
            "ppo_max_token_len_per_gpu",
            "forward_max_token_len_per_gpu",
            "ulysses_sequence_parallel_size",
        )
        optional_positive_int(
            self,
            "ppo_micro_batch_size_per_gpu",
            "forward_micro_batch_size_per_gpu",
            "ppo_micro_batch_size",
            "forward_micro_batch_size",
        )
        positive(self, "cliprange_value", "grad_clip")
