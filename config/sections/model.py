"""The ``model`` section of the policy and of the critic: which Hugging Face model, how it is loaded, LoRA, and
the forward's kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from config.checks import check, is_int, positive


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = None  # HF model dir; null -> the built-in tiny model
    trust_remote_code: bool = False
    # Hugging Face config attributes replaced when the model loads (+model.override_config.attention_dropout=0.0)
    override_config: dict[str, Any] = field(default_factory=dict)
    enable_gradient_checkpointing: bool = True
    use_remove_padding: bool = True  # log-prob and update forwards on packed rows (no pad tokens computed)
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank instead of the full model
    lora_alpha: float = 16
    target_modules: Any = "all-linear"  # "all-linear" or a list of module names
    # log-probs, entropy and the exact KL from hidden states in chunks of tokens, logits recomputed in backward:
    # never the (tokens, vocabulary) logits (workers/compute/logprob.py)
    use_fused_kernels: bool = False

    def __post_init__(self) -> None:
        check(self, ["lora_rank"], lambda v: is_int(v) and v >= 0, "must be 0 (full fine-tuning) or a positive rank")
        positive(self, "lora_alpha")


@dataclass(frozen=True)
class CriticModelConfig(ModelConfig):
    """The critic's model: null path -> the policy's (``actor_rollout_ref.model.path``)."""

    trust_remote_code: bool = "${actor_rollout_ref.model.trust_remote_code}"  # type: ignore[assignment]
