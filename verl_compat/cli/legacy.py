"""verl's older top-level reward sections: ``custom_reward_function``, ``reward_model`` and ``sandbox_fusion``.

Null means not set: ``normalize.migrate_legacy_reward`` moves what is set into ``reward`` as verl does, so ColoRL
reads ``reward`` only. They load as given, in ``VerlPPOConfig`` (``schema``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from config.tree import InertTree


@dataclass(frozen=True)
class LegacyCustomRewardFunctionConfig:
    path: str | None = None
    name: str | None = None


class LegacyRewardRolloutTree(InertTree):
    DEFAULTS: ClassVar[dict[str, Any]] = {
        key: None
        for key in (
            "name dtype gpu_memory_utilization enforce_eager cudagraph_capture_sizes free_cache_engine "
            "data_parallel_size expert_parallel_size tensor_model_parallel_size max_num_batched_tokens max_model_len "
            "max_num_seqs load_format engine_kwargs limit_images enable_chunked_prefill enable_prefix_caching "
            "disable_log_stats skip_tokenizer_init prompt_length response_length"
        ).split()
    }


@dataclass(frozen=True)
class LegacyRewardModelPathConfig:
    path: str | None = None
    external_lib: str | None = None
    trust_remote_code: bool | None = None


@dataclass(frozen=True)
class LegacyRewardModelConfig:
    num_workers: int | None = None
    reward_manager: str | None = None
    enable: bool | None = None
    enable_resource_pool: bool | None = None
    n_gpus_per_node: int | None = None
    nnodes: int | None = None
    reward_loop_source: str | None = None
    reward_loop_module_path: str | None = None
    reward_loop_class_name: str | None = None
    model: LegacyRewardModelPathConfig = field(default_factory=LegacyRewardModelPathConfig)
    rollout: LegacyRewardRolloutTree = field(default_factory=LegacyRewardRolloutTree.default)
    reward_kwargs: dict[str, Any] | None = None


@dataclass(frozen=True)
class LegacySandboxFusionConfig:
    url: str | None = None
    max_concurrent: int | None = None
    memory_limit_mb: int | None = None
