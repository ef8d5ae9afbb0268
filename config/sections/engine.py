"""The training engine of a role: optimizer and learning-rate schedule, FSDP sharding and precision, checkpoints.

verl's ``optim``, ``fsdp_config`` (the critic's ``fsdp``) and ``checkpoint`` sections with verl's keys and defaults.
What ColoRL does with the keys of verl's other engines (FSDP1 flags, QAT, torchtitan's turbo plan) is said in
``cli.inert``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from config.checks import ConfigError, check, is_int, is_number, non_negative, positive, unit_interval
from config.tree import InertTree

# verl's spellings too; fp16 would need loss scaling, which the updates do not do
ParamDtype = Literal["auto", "native", "bf16", "fp32", "bfloat16", "float32"]
ReduceDtype = Literal["fp32", "bf16", "float32", "bfloat16"]
Strategy = Literal["fsdp", "fsdp2"]  # ColoRL shards with FSDP2; verl's FSDP1 ("fsdp") computes the same numbers


@dataclass(frozen=True)
class OptimConfig:
    """verl's ``FSDPOptimizerConfig``: ``optimizer`` from ``optimizer_impl`` (ColoRL's fused AdamW for torch.optim's
    AdamW), linear warm-up, then constant or cosine (down to ``min_lr_ratio`` × lr over ``num_cycles`` waves)."""

    _target_: str = "verl.workers.config.FSDPOptimizerConfig"
    optimizer: str = "AdamW"
    optimizer_impl: str = "torch.optim"
    lr: float = 1e-6
    lr_warmup_steps_ratio: float = 0.0
    total_training_steps: int = -1  # set by the trainer (verl injects it at run time)
    weight_decay: float = 0.01
    lr_warmup_steps: int = -1  # -1 -> use lr_warmup_steps_ratio
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    clip_grad: float = 1.0  # the role's gradient-norm clip (verl's engine key; the role's grad_clip is the same)
    min_lr_ratio: float | None = 0.0  # cosine: the floor, as a share of lr (null: 0)
    num_cycles: float = 0.5  # cosine: 0.5 is one half-wave from lr down to the floor
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"  # after the linear warm-up
    # warm-up and cosine count the k-th update from 0 (verl's default: the first update has lr 0 when warming up);
    # false counts from 1. ColoRL applies it to both schedules (verl to cosine only)
    zero_indexed_step: bool = True
    warmup_style: Literal["constant", "cosine"] | None = None  # verl's older name of lr_scheduler_type
    override_optimizer_config: dict[str, Any] | None = None  # extra keyword arguments of the optimizer

    def __post_init__(self) -> None:
        positive(self, "lr", "clip_grad")
        check(self, ["lr_warmup_steps"], lambda v: is_int(v) and v >= -1, "must be -1 (use the ratio) or >= 0")
        unit_interval(self, "lr_warmup_steps_ratio")
        non_negative(self, "weight_decay")
        check(self, ["min_lr_ratio"], lambda v: v is None or (is_number(v) and 0 <= v <= 1), "must be in [0, 1]")
        positive(self, "num_cycles")
        check(
            self,
            ["betas"],
            lambda v: len(v) == 2 and all(is_number(b) and 0 <= b < 1 for b in v),
            "must be two numbers in [0, 1)",
        )
        if self.warmup_style is not None and self.warmup_style != self.lr_scheduler_type:
            raise ConfigError.invalid(
                "warmup_style",
                self.warmup_style,
                f"contradicts lr_scheduler_type={self.lr_scheduler_type} (its newer name)",
            )


@dataclass(frozen=True)
class MixedPrecisionConfig:
    """Compute dtype of the sharded model; gradients reduce in reduce_dtype. auto = bf16 on CUDA, fp32 on CPU;
    native = bf16 where the device multiplies bf16 natively (CUDA, a CPU with AVX512-BF16 or AMX), else fp32.
    verl's ``fsdp_config.dtype`` other than bfloat16 sets it where it is auto (``cli.normalize``)."""

    param_dtype: ParamDtype = "auto"
    reduce_dtype: ReduceDtype = "fp32"


@dataclass(frozen=True)
class WrapPolicyConfig:
    """FSDP units: consecutive transformer blocks grouped into units of at least min_num_params parameters
    (0: a unit per block); blocks after the last full unit share the root's group. verl's key name; its FSDP1
    path wraps any submodule of that size instead."""

    min_num_params: int = 0

    def __post_init__(self) -> None:
        non_negative(self, "min_num_params")


class QATTree(InertTree):
    """Quantisation-aware training (verl's ``qat``): not in ColoRL; enabling it is refused (``cli.inert``)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.workers.config.QATEngineConfig",
        "enable": False,
        "mode": "w4a16",
        "group_size": 16,
        "ignore_patterns": ["lm_head", "embed_tokens", "re:.*mlp.gate$"],
        "activation_observer": "static_minmax",
        "quantization_config_path": None,
    }


class TurboTree(InertTree):
    """torchtitan's sharding plan (``strategy=fsdp_turbo``): not in ColoRL."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "distributed": {
            "fully_shard_parallel_size": 16,
            "tensor_parallel_size": 1,
            "expert_parallel_size": 1,
            "expert_fully_shard_parallel_size": 1,
            "ulysses_parallel_size": 1,
            "fsdp_plan": {
                "param_dtype": "bf16",
                "reduce_dtype": "fp32",
                "output_dtype": "bf16",
                "fsdp_implementation": "native",
                "num_to_forward_prefetch": 1,
                "num_to_backward_prefetch": 1,
            },
        }
    }


@dataclass(frozen=True)
class FSDPConfig:
    """verl's ``FSDPEngineConfig`` of a trained role (actor, critic): ColoRL shards every role with FSDP2 over all
    workers. ``param_offload``/``optimizer_offload`` move weights/optimizer state to the CPU between phases."""

    _target_: str = "verl.workers.config.FSDPEngineConfig"
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    param_offload: bool = False
    optimizer_offload: bool = False
    offload_policy: bool = False  # FSDP2's CPUOffloadPolicy: ColoRL's param_offload does this
    reshard_after_forward: bool = True
    fsdp_size: int = -1  # verl's hybrid-shard group size; ColoRL shards over all workers (-1)
    forward_prefetch: bool = False
    model_dtype: str = "fp32"  # the dtype weights are loaded (and trained roles' masters kept) in
    use_orig_params: bool = False
    seed: int = 42
    full_determinism: bool = False
    ulysses_sequence_parallel_size: int = 1
    entropy_from_logits_with_chunking: bool = "${oc.select:..entropy_from_logits_with_chunking,false}"  # type: ignore
    entropy_from_logits_chunk_size: int = "${oc.select:..entropy_from_logits_chunk_size,2048}"  # type: ignore
    use_torch_compile: bool = True
    entropy_checkpointing: bool = "${oc.select:..entropy_checkpointing,false}"  # type: ignore[assignment]
    use_no_sync_for_gradient_accumulation: bool = False
    pad_to_length: bool = "${oc.select:..pad_to_length,false}"  # type: ignore[assignment]
    pad_to_length_bucket: int = 1024
    forward_only: bool = False
    strategy: Strategy = "fsdp"
    dtype: str = "bfloat16"  # verl's compute dtype (cli.normalize maps it onto mixed_precision.param_dtype)
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)  # ColoRL's (and verl's, +)
    qat: QATTree = field(default_factory=QATTree.default)
    turbo_config: TurboTree = field(default_factory=TurboTree.default)


@dataclass(frozen=True)
class RefFSDPConfig(FSDPConfig):
    """A frozen role's FSDP settings (reference, reward model): verl's defaults for a forward-only engine."""

    forward_only: bool = True
    pad_to_length_bucket: int = "${oc.select:actor_rollout_ref.actor.fsdp_config.pad_to_length_bucket,1024}"  # type: ignore


class CheckpointTree(InertTree):
    """verl's ``checkpoint`` section of a trained role: ColoRL saves and resumes the whole state (``cli.inert``)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.trainer.config.CheckpointConfig",
        "save_contents": ["model", "optimizer", "extra"],
        "load_contents": ["model", "optimizer", "extra"],
        "async_save": False,
        "strict": True,
    }


class CriticCheckpointTree(InertTree):
    DEFAULTS: ClassVar[dict[str, Any]] = {k: v for k, v in CheckpointTree.DEFAULTS.items() if k != "strict"}
