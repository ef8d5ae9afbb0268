"""How ``rollout.name=vllm`` is set up: the checks made before any worker starts, the KV cache a CPU engine
reserves, and the ``vllm.LLM`` arguments of a rollout section (the engine itself is ``vllm_rollout``).

The engine's settings come from the rollout's keys (``ENGINE_KEYS``) and ``rollout.engine_kwargs["vllm"]`` (any other
``vllm.EngineArgs`` field, which wins). On a CPU, where vLLM reads ``gpu_memory_utilization`` as a share of host
RAM, the KV cache is sized for the step's rows at full length instead (``cpu_kv_cache_bytes``), within that
share of RAM over the machine's workers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psutil
import torch

from config import ConfigError
from config.engine import CPU_HEAD_SIZES, INSTALL, head_size, vllm_installed

MISSING = (
    f"actor_rollout_ref.rollout.name=vllm: vLLM is not installed; install the extra: {INSTALL} (make setup does it "
    "on Linux x86-64), or use rollout.name=hf"
)
CPU_BLOCK_SIZE = 128  # vLLM's KV cache block on a CPU (tokens)
# measured: a CPU worker's RSS grows by 0.26 GiB when it imports vLLM and starts an engine of a tiny model
VLLM_RUNTIME_CPU_BYTES = int(0.3 * 2**30)
# the rollout keys that become vLLM engine arguments (rollout key -> EngineArgs field)
ENGINE_KEYS = {
    "enforce_eager": "enforce_eager",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "max_num_seqs": "max_num_seqs",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "enable_prefix_caching": "enable_prefix_caching",
    "load_format": "load_format",
    "tensor_model_parallel_size": "tensor_parallel_size",
}


def check_vllm(rollout: Any, device: str, workers: int, model: tuple[str, Callable[[], Any]] | None = None) -> None:
    """One line (``ConfigError``) before any worker starts: vLLM missing, a tensor-parallel size this device
    and worker group cannot run, or on a CPU a model (``model``: its name and a reader of its transformers config)
    whose attention heads vLLM's CPU kernels do not take."""
    if rollout.name != "vllm":
        return
    if not vllm_installed():
        raise ConfigError(MISSING)
    if device == "cpu" and model is not None and (size := head_size(model[1]())) not in CPU_HEAD_SIZES:
        raise ConfigError(
            f"actor_rollout_ref.rollout.name=vllm: {model[0]} has attention heads of size {size}; vLLM's CPU "
            f"attention takes {', '.join(map(str, CPU_HEAD_SIZES))} (use rollout.name=hf for this model)"
        )
    key, tp = "actor_rollout_ref.rollout.tensor_model_parallel_size", rollout.tensor_model_parallel_size
    if device == "cpu" and tp != 1:
        raise ConfigError.invalid(key, tp, "vLLM's CPU backend runs one engine per worker: set it to 1")
    if workers % tp:
        raise ConfigError.invalid(key, tp, f"the engine's ranks are the workers': must divide their {workers}")
    if tp > 1 and rollout.multi_turn.enable:
        raise ConfigError.invalid(key, tp, "the multi-turn loop samples per worker: set it to 1 with multi_turn")


def cpu_kv_cache_bytes(rollout: Any, layers: int, kv_dim: int, element_size: int, rows: int, workers: int) -> int:
    """The KV cache a CPU engine reserves: ``rows`` sequences of ``max_model_len`` tokens in whole blocks, keys and
    values of ``layers`` layers × ``kv_dim`` (KV heads × head dim), within ``gpu_memory_utilization`` of the
    host's RAM over the machine's ``workers``."""
    block = rollout.engine_kwargs["vllm"].get("block_size", CPU_BLOCK_SIZE)
    tokens = rows * -(-max_model_len(rollout) // block) * block
    share = rollout.gpu_memory_utilization * psutil.virtual_memory().total / workers
    explicit = rollout.engine_kwargs["vllm"].get("kv_cache_memory_bytes")
    return int(explicit or min(2 * layers * kv_dim * element_size * tokens, share))


def max_model_len(rollout: Any) -> int:
    return int(rollout.max_model_len or rollout.prompt_length + rollout.response_length)


def engine_args(
    model_config: Any, rollout: Any, device: torch.device, dtype: torch.dtype, seed: int, rows: int, workers: int
) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments of ``rollout`` for one of ``workers`` workers on its machine, which samples
    ``rows`` sequences a step."""
    args: dict[str, Any] = {key: getattr(rollout, ours) for ours, key in ENGINE_KEYS.items()}
    # the "dummy" load format (random weights until the first sync) would leave vLLM's own derived tensors, which
    # no sync overwrites, random too in vLLM 0.32: the checkpoint is read once instead
    if args["load_format"] == "dummy":
        args["load_format"] = "auto"
    args.update(
        model=model_config.path,
        trust_remote_code=model_config.trust_remote_code,
        dtype=dtype,
        seed=seed,
        max_model_len=max_model_len(rollout),
        skip_tokenizer_init=True,  # token ids in, token ids out
        logprobs_mode="processed_logprobs",  # under the temperature-scaled policy
    )
    if device.type == "cuda":  # sleep mode frees weights and KV cache between rollouts
        args.update(gpu_memory_utilization=rollout.gpu_memory_utilization, enable_sleep_mode=True)
        if args["tensor_parallel_size"] > 1:  # the TP group's ranks are the worker group's (a hybrid engine)
            args["distributed_executor_backend"] = "external_launcher"
    else:  # on a CPU, where vLLM reads the key as a share of host RAM: the step's rows at full length, within it
        from transformers import AutoConfig

        hf = AutoConfig.from_pretrained(model_config.path, trust_remote_code=model_config.trust_remote_code)
        kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
        kv_dim = kv_heads * head_size(hf)
        element_size = torch.tensor([], dtype=dtype).element_size()
        args["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(
            rollout, hf.num_hidden_layers, kv_dim, element_size, rows, workers
        )
    args.update(rollout.engine_kwargs["vllm"])
    return args
