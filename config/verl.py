"""verl command lines on ColoRL: the key aliases, and the keys of machinery ColoRL does not have.

verl's keys and defaults are ColoRL's (``config.schema``, ``config.roles``), so a verl command line means the
same here. A few of its keys configure machinery ColoRL does not have (the SGLang rollout engine, Ulysses
sequence parallelism, hybrid sharding, HDFS copies): they are accepted, and a value other than the default gets
one warning line saying what ColoRL does instead. Keys whose ignoring would change the result are refused where
they are checked (e.g. ``rollout.multi_turn.interaction_config_path``, in ``config.roles``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from functools import reduce
from typing import Any

from config.schema import PPOConfig

# verl's place of a key -> ColoRL's (prefixes): the critic and the reward model keep fsdp_config beside model
ALIASES = {
    "critic.model.fsdp_config.": "critic.fsdp_config.",
    "reward_model.model.fsdp_config.": "reward_model.fsdp_config.",
}

# key -> what ColoRL does instead (shown when the key's value differs from its default)
IGNORED = {
    "actor_rollout_ref.rollout.name": "ColoRL generates with the actor's own FSDP model (rollout.name=hf) or a "
    "vLLM engine beside it (rollout.name=vllm); SGLang is not in ColoRL",
    "actor_rollout_ref.rollout.mode": "ColoRL's rollout generates each step's batch at once (mode=sync)",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "the rollout runs on the actor's FSDP model, "
    "gathered on each worker, without tensor parallelism",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "no inference engine reserves memory; the KV cache is "
    "allocated per batch",
    "actor_rollout_ref.rollout.load_format": "the rollout computes with the actor's weights in place",
    "actor_rollout_ref.rollout.layered_summon": "the actor's FSDP groups are gathered once per generation",
    "actor_rollout_ref.rollout.max_model_len": "sequences are data.max_prompt_length + max_response_length",
    "actor_rollout_ref.rollout.max_num_batched_tokens": "each worker decodes its whole share of the batch",
    "actor_rollout_ref.rollout.max_num_seqs": "each worker decodes its whole share of the batch",
    "actor_rollout_ref.rollout.enforce_eager": "decoding is eager unless actor.use_torch_compile=true",
    "actor_rollout_ref.rollout.free_cache_engine": "the KV cache is freed after every generation",
    "actor_rollout_ref.rollout.enable_chunked_prefill": "each prompt batch is prefilled in one forward",
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": "later turns continue from the recorded "
    "token ids of the earlier ones",
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": "each row is rolled out once; rollout.n repeats "
    "the prompts",
    "actor_rollout_ref.rollout.agent.num_workers": "each rollout worker runs the agent loop for its rows",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "each worker runs whole sequences",
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": "FSDP shards each model over all workers",
    "actor_rollout_ref.model.use_shm": "the model is read from its directory",
    "trainer.default_hdfs_dir": "checkpoints stay in trainer.default_local_dir",
    "algorithm.filter_groups.max_inflight_gen_batches": "dynamic sampling generates one batch at a time",
    "trainer.use_legacy_worker_impl": "ColoRL has one worker implementation",
}


# the keys that configure the vLLM engine of rollout.name=vllm (workers.compute.vllm_rollout), which reads them; with the HF
# rollout they warn as above. layered_summon: the engine always takes the actor's weights one FSDP unit at a time
VLLM_KEYS = {
    f"actor_rollout_ref.rollout.{key}"
    for key in (
        "name",
        "tensor_model_parallel_size",
        "gpu_memory_utilization",
        "load_format",
        "layered_summon",
        "max_model_len",
        "max_num_batched_tokens",
        "max_num_seqs",
        "enforce_eager",
        "free_cache_engine",
        "enable_chunked_prefill",
    )
}


def rewrite_aliases(overrides: Sequence[str]) -> list[str]:
    """Command-line overrides with verl's key paths (``ALIASES``) moved to ColoRL's; ``+``/``~`` prefixes kept,
    except a ``+`` on a key the schema has: verl's scripts add keys its YAML lacks (``+reward.reward_kwargs.*``),
    which ColoRL's schema declares, so there the override is a plain one."""
    out = []
    for override in overrides:
        sign = override[: len(override) - len(override.lstrip("+~"))]
        body = override[len(sign) :]
        for verl_prefix, colorl_prefix in ALIASES.items():
            if body.startswith(verl_prefix):
                body = colorl_prefix + body[len(verl_prefix) :]
        if sign == "+" and _in_schema(body.partition("=")[0]):
            sign = ""
        out.append(sign + body)
    return out


def _in_schema(key: str) -> bool:
    node: Any = PPOConfig
    for part in key.split("."):
        fields = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        if part not in fields:
            return False
        node = typing.get_type_hints(node)[part]
    return True


def _value(cfg: Any, key: str) -> Any:
    return reduce(getattr, key.split("."), cfg)


def ignored_key_warnings(cfg: PPOConfig) -> list[str]:
    """One line per key of ``IGNORED`` set to something other than its default, naming what ColoRL does."""
    defaults = PPOConfig()
    lines = []
    engine_reads = VLLM_KEYS if cfg.actor_rollout_ref.rollout.name == "vllm" else set()
    for key, instead in IGNORED.items():
        if key in engine_reads:
            continue
        value, default = _value(cfg, key), _value(defaults, key)
        if value != default:
            lines.append(f"{key}={value}: {instead}; set {key}={default} to silence this")
    return lines
