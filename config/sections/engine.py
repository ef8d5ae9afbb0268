"""The training engine of a role: optimizer and learning-rate schedule, FSDP sharding and precision.

A role's ``optim`` and ``fsdp_config`` (the critic's ``fsdp``) sections: the keys ColoRL's FSDP2 engine reads. Keys
of other engines a command-line dialect accepts are its own (``config.adapter``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from config.checks import check, is_int, is_number, non_negative, positive, unit_interval

# both spellings of each dtype; fp16 would need loss scaling, which the updates do not do
ParamDtype = Literal["auto", "native", "bf16", "fp32", "bfloat16", "float32"]
ReduceDtype = Literal["fp32", "bf16", "float32", "bfloat16"]


@dataclass(frozen=True)
class OptimConfig:
    """A role's optimizer: ``optimizer`` from ``optimizer_impl`` (a fused AdamW for torch.optim's AdamW), linear
    warm-up, then constant or cosine (down to ``min_lr_ratio`` × lr over ``num_cycles`` waves)."""

    optimizer: str = "AdamW"
    optimizer_impl: str = "torch.optim"
    lr: float = 1e-6
    lr_warmup_steps_ratio: float = 0.0
    weight_decay: float = 0.01
    lr_warmup_steps: int = -1  # -1 -> use lr_warmup_steps_ratio
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    min_lr_ratio: float | None = 0.0  # cosine: the floor, as a share of lr (null: 0)
    num_cycles: float = 0.5  # cosine: 0.5 is one half-wave from lr down to the floor
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"  # after the linear warm-up
    # warm-up and cosine count the k-th update from 0 (the first update has lr 0 when warming up); false counts
    # from 1. Both schedules read it
    zero_indexed_step: bool = True
    override_optimizer_config: dict[str, Any] | None = None  # extra keyword arguments of the optimizer

    def __post_init__(self) -> None:
        positive(self, "lr")
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


@dataclass(frozen=True)
class MixedPrecisionConfig:
    """Compute dtype of the sharded model; gradients reduce in reduce_dtype. auto = bf16 on CUDA, fp32 on CPU;
    native = bf16 where the device multiplies bf16 natively (CUDA, a CPU with AVX512-BF16 or AMX), else fp32."""

    param_dtype: ParamDtype = "auto"
    reduce_dtype: ReduceDtype = "fp32"


@dataclass(frozen=True)
class WrapPolicyConfig:
    """FSDP units: consecutive transformer blocks grouped into units of at least min_num_params parameters
    (0: a unit per block); blocks after the last full unit share the root's group."""

    min_num_params: int = 0

    def __post_init__(self) -> None:
        non_negative(self, "min_num_params")


@dataclass(frozen=True)
class FSDPConfig:
    """How a trained role (actor, critic) is sharded: FSDP2 over all workers. ``param_offload``/``optimizer_offload``
    move weights/optimizer state to the CPU between phases."""

    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    param_offload: bool = False
    optimizer_offload: bool = False
    reshard_after_forward: bool = True
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass(frozen=True)
class RefFSDPConfig(FSDPConfig):
    """A frozen role's FSDP settings (reference, reward model, teachers): the trained roles' keys; a command-line
    dialect may give its forward-only engine other defaults (``config.adapter``)."""
