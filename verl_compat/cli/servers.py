"""verl's inference servers' settings ColoRL does not have: the rollout's weight transfer, tracing, Prometheus
metrics, prefill/decode disaggregation, a custom agent-loop server; the reward model's own inference server; the
code-execution sandbox of code rewards. Loaded with verl's defaults (``schema``); ``inert`` warns about, or
refuses, values set away from them. ColoRL's rollout and reward model run on the training workers, with the
actor's weights in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from config.tree import InertTree


class CustomAsyncServerTree(InertTree):
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.workers.config.CustomAsyncServerConfig",
        "path": None,
        "name": None,
    }


class CheckpointEngineTree(InertTree):
    """How verl moves the trained weights into the inference engine; ColoRL's rollout uses them in place."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.workers.config.CheckpointEngineConfig",
        "backend": "naive",
        "update_weights_bucket_megabytes": 2048,
        "engine_kwargs": {},
        "custom_backend_module": None,
    }


class TraceTree(InertTree):
    """verl's rollout tracing (weave, mlflow); verl fills the names from the trainer's when null."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.workers.config.TraceConfig",
        "project_name": None,
        "experiment_name": None,
        "backend": None,
        "token2text": False,
        "max_samples_per_step_per_worker": None,
    }


class PrometheusTree(InertTree):
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.workers.config.PrometheusConfig",
        "enable": False,
        "port": 9090,
        "file": "/tmp/ray/session_latest/metrics/prometheus/prometheus.yml",
        "served_model_name": None,
    }


class DisaggregationTree(InertTree):
    """Prefill/decode disaggregation of an inference server."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "enabled": False,
        "prefill_replicas": 1,
        "decode_replicas": 1,
        "decode_tensor_model_parallel_size": None,
        "transfer_backend": "nixl",
        "bootstrap_port": None,
        "ib_device": None,
    }


class RewardRolloutTree(InertTree):
    """verl serves its reward model with an inference engine; ColoRL runs it as an FSDP role (cli.inert)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.workers.config.RolloutConfig",
        "name": None,
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.5,
        "enforce_eager": True,
        "cudagraph_capture_sizes": None,
        "free_cache_engine": True,
        "data_parallel_size": 1,
        "expert_parallel_size": 1,
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 1,
        "max_num_batched_tokens": 8192,
        "max_model_len": None,
        "max_num_seqs": 1024,
        "load_format": "auto",
        "layered_summon": False,
        "scheduling_policy": "fcfs",
        "full_determinism": False,
        "seed": 42,
        "multi_stage_wake_up": False,
        "engine_kwargs": {},
        "limit_images": None,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "disable_log_stats": True,
        "skip_tokenizer_init": False,
        "ignore_eos": False,
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 1,
        "do_sample": True,
        "n": 1,
        "prompt_length": 2048,
        "response_length": 2048,
        "quantization": None,
        "quantization_config_file": None,
        "mtp": None,
        "disaggregation": dict(DisaggregationTree.DEFAULTS),  # the rollout's section of the same name
    }


@dataclass(frozen=True)
class SandboxFusionConfig:
    """verl's code-execution sandbox for code rewards: not in ColoRL (a url is refused, cli.inert)."""

    _target_: str = "verl.workers.config.SandboxFusionConfig"
    url: str | None = None
    max_concurrent: int = 64
    memory_limit_mb: int = 1024


@dataclass(frozen=True)
class TeacherInferenceConfig:
    """``teacher_models.<name>.inference``: verl's teacher inference server. ColoRL's teacher is a colocated FSDP
    forward; these keys are accepted and warn when set (null ones follow the student's rollout in verl)."""

    _target_: str = "verl.workers.config.RolloutConfig"
    name: str | None = None
    dtype: str | None = None
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    cudagraph_capture_sizes: Any = None
    free_cache_engine: bool = True
    data_parallel_size: int = 1
    expert_parallel_size: int = 1
    tensor_model_parallel_size: int = 2
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    max_num_seqs: int = 1024
    load_format: str = "auto"
    engine_kwargs: Any = field(default_factory=dict)
    limit_images: Any = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    disable_log_stats: bool = True
    skip_tokenizer_init: bool = True
    prompt_length: int | None = None
    response_length: int | None = None
    temperature: float | None = None
