"""verl's ``model`` section (``HFModelConfig``) of the policy and of the critic: which Hugging Face model, how it is
loaded, LoRA, and the forward's kernels. What ColoRL does with the keys of machinery it does not have (Liger,
Megatron's LoRA, multi-token prediction, activation offload) is said in ``cli.inert``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from config.checks import check, is_int, positive
from config.tree import InertTree


class MtpTree(InertTree):
    """Multi-token prediction heads (verl's ``mtp``): not in ColoRL; enabling them is refused."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.workers.config.MtpConfig",
        "enable": False,
        "enable_train": False,
        "enable_rollout": False,
        "detach_encoder": False,
        "mtp_loss_scaling_factor": 0.1,
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "method": "mtp",
        "num_speculative_tokens": 1,
    }


class MegatronLoraTree(InertTree):
    """Megatron's LoRA (verl's ``model.lora``, read by its Megatron engine only); ColoRL's LoRA is ``lora_rank``."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "type": "lora",
        "merge": False,
        "rank": 0,
        "alpha": 32,
        "dropout": 0.0,
        "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
        "exclude_modules": [],
        "dropout_position": "pre",
        "lora_A_init_method": "xavier",
        "lora_B_init_method": "zero",
        "a2a_experimental": False,
        "dtype": None,
        "adapter_path": None,
        "freeze_vision_model": True,
        "freeze_vision_projection": True,
        "freeze_language_model": True,
    }


class FusedKernelOptionsTree(InertTree):
    DEFAULTS: ClassVar[dict[str, Any]] = {"impl_backend": "torch"}


class TiledMLPTree(InertTree):
    DEFAULTS: ClassVar[dict[str, Any]] = {"enabled": False, "num_shards": 4}


@dataclass(frozen=True)
class ModelConfig:
    _target_: str = "verl.workers.config.HFModelConfig"
    path: str | None = None  # HF model dir; null -> the built-in tiny model (verl: a placeholder path)
    hf_config_path: str | None = None
    tokenizer_path: str | None = None  # null -> the model's own tokenizer
    use_shm: bool = False  # verl copies the model to shared memory first; ColoRL reads it where it is
    trust_remote_code: bool = False
    custom_chat_template: str | None = None
    external_lib: str | None = None
    # Hugging Face config attributes replaced when the model loads (+model.override_config.attention_dropout=0.0)
    override_config: dict[str, Any] = field(default_factory=dict)
    enable_gradient_checkpointing: bool = True
    enable_activation_offload: bool = False
    use_remove_padding: bool = True  # log-prob and update forwards on packed rows (no pad tokens computed)
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank instead of the full model
    lora_alpha: float = 16
    target_modules: Any = "all-linear"  # "all-linear" or a list of module names
    exclude_modules: Any = None
    lora_adapter_path: str | None = None
    use_liger: bool = False
    # log-probs, entropy and the exact KL from hidden states in chunks of tokens, logits recomputed in backward:
    # never the (tokens, vocabulary) logits (workers/compute/logprob.py)
    use_fused_kernels: bool = False
    fused_kernel_options: FusedKernelOptionsTree = field(default_factory=FusedKernelOptionsTree.default)
    tiled_mlp: TiledMLPTree = field(default_factory=TiledMLPTree.default)
    mtp: MtpTree = field(default_factory=MtpTree.default)
    lora: MegatronLoraTree = field(default_factory=MegatronLoraTree.default)

    def __post_init__(self) -> None:
        check(self, ["lora_rank"], lambda v: is_int(v) and v >= 0, "must be 0 (full fine-tuning) or a positive rank")
        positive(self, "lora_alpha")


@dataclass(frozen=True)
class CriticModelConfig(ModelConfig):
    """The critic's model: null path -> the policy's (``actor_rollout_ref.model.path``)."""

    trust_remote_code: bool = "${actor_rollout_ref.model.trust_remote_code}"  # type: ignore[assignment]
