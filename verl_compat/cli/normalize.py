"""verl command lines on ColoRL: older spellings of keys, and the keys verl derives from others.

verl's keys and defaults are ColoRL's (``config.schema``, ``config.sections``), so a verl command line means the same
here. verl also accepts older places of some keys, and fills some keys from others when it starts; both happen
here, on the composed config, before it is built (``config.load.to_config``):

- ``ALIASES``: an older key path moves to its current one (command-line overrides and whole YAML trees alike);
- ``migrate_legacy_reward``: the older top-level ``custom_reward_function``, ``reward_model`` and
  ``sandbox_fusion`` move into ``reward`` where set (verl's ``migrate_legacy_reward_impl``);
- ``normalize``: what verl computes from the keys as it starts (global micro-batches ÷ workers, the deprecated
  ``warmup_style``, bypass mode's loss, the compute dtype, the gradient clip's two names).

What ColoRL does with the keys of machinery it does not have is ``verl_compat.cli.inert``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from omegaconf import OmegaConf

from config.checks import ConfigError
from config.tree import ARR, flat

# an older place of a key -> its current one (prefixes; a "+" before an aliased override is dropped: the target
# exists). ColoRL's own older spellings are here too.
ALIASES = {
    "ray_init.": "ray_kwargs.ray_init.",
    "critic.model.fsdp_config.": "critic.fsdp.",
    "critic.fsdp_config.": "critic.fsdp.",
    "reward_model.model.fsdp_config.": "reward.reward_model.fsdp_config.",
    "reward_model.fsdp_config.": "reward.reward_model.fsdp_config.",
    "reward_model.micro_batch_size_per_gpu": "reward.reward_model.micro_batch_size_per_gpu",
    f"{ARR}.actor.policy_loss.tau_pos": f"{ARR}.actor.tau_pos",  # SAPO's scripts: +policy_loss.tau_pos
    f"{ARR}.actor.policy_loss.tau_neg": f"{ARR}.actor.tau_neg",
}
# verl's global micro-batch keys (sequences over all workers) -> their per-worker keys
GLOBAL_MICRO_BATCHES = {
    f"{ARR}.actor.ppo_micro_batch_size": f"{ARR}.actor.ppo_micro_batch_size_per_gpu",
    f"{ARR}.rollout.log_prob_micro_batch_size": f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
    f"{ARR}.ref.log_prob_micro_batch_size": f"{ARR}.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size": "critic.forward_micro_batch_size_per_gpu",
}
# verl's older reward sections: a key -> its place in reward.* (verl's migrate_legacy_reward_impl)
LEGACY_REWARD = {
    "reward_model.num_workers": "reward.num_workers",
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.reward_loop_source": "reward.reward_manager.source",
    "reward_model.reward_loop_module_path": "reward.reward_manager.module.path",
    "reward_model.reward_loop_class_name": "reward.reward_manager.module.name",
    "reward_model.enable": "reward.reward_model.enable",
    "reward_model.enable_resource_pool": "reward.reward_model.enable_resource_pool",
    "reward_model.n_gpus_per_node": "reward.reward_model.n_gpus_per_node",
    "reward_model.nnodes": "reward.reward_model.nnodes",
    "reward_model.model.path": "reward.reward_model.model_path",
    "reward_model.reward_kwargs": "reward.reward_kwargs",
    "custom_reward_function.path": "reward.custom_reward_function.path",
    "custom_reward_function.name": "reward.custom_reward_function.name",
    "sandbox_fusion.url": "reward.sandbox_fusion.url",
    "sandbox_fusion.max_concurrent": "reward.sandbox_fusion.max_concurrent",
    "sandbox_fusion.memory_limit_mb": "reward.sandbox_fusion.memory_limit_mb",
}
DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float32": "fp32", "fp32": "fp32"}
FSDP_SECTIONS = (f"{ARR}.actor.fsdp_config", f"{ARR}.ref.fsdp_config", "critic.fsdp", "reward.reward_model.fsdp_config")


def _aliased(key: str) -> str:
    for old, new in ALIASES.items():
        if key == old or (old.endswith(".") and key.startswith(old)):
            return new + key[len(old) :]
    return key


def current_place(key: str) -> str:
    """Where dotted ``key`` of an older spelling lives now (``ALIASES``, ``LEGACY_REWARD``; itself when it has not
    moved): a checkpoint's recorded config is compared key by key with today's (``trainer.state.fingerprint``)."""
    key = _aliased(key)
    for old, new in LEGACY_REWARD.items():
        if key == old or key.startswith(f"{old}."):
            return new + key[len(old) :]
    if key.startswith("reward_model.rollout."):
        return "reward." + key
    return key


def rewrite_aliases(overrides: Sequence[str]) -> list[str]:
    """Command-line overrides with older key paths (``ALIASES``) moved to the current ones; ``~`` kept, ``+`` dropped
    for a moved key (its current place exists)."""
    out = []
    for override in overrides:
        body = override.lstrip("+~")
        sign = override[: len(override) - len(body)]
        key, eq, value = body.partition("=")
        moved = _aliased(key)
        out.append(override if moved == key else sign.replace("+", "") + moved + eq + value)
    return out


def normalize(written: dict) -> dict:
    """A copy of the composed config ``written`` (a plain container, interpolations as written) with older key
    places moved, the legacy reward sections migrated and verl's start-up derivations applied; ConfigError for a
    contradiction."""
    node = copy.deepcopy(written)
    for key, value in list(flat(node)):
        moved = _aliased(key)
        if moved != key:
            _delete(node, key)
            _set(node, moved, value)
    for old in ALIASES:  # the older sections the moves emptied (ray_init, critic.fsdp_config)
        if old.endswith(".") and _is_empty(_get(node, old[:-1], 0)):
            _delete(node, old[:-1])
    migrate_legacy_reward(node)
    _micro_batches(node)
    _optimizers(node)
    for section in FSDP_SECTIONS:
        _compute_dtype(node, section)
    if (_get(node, f"{ARR}.model.lora_rank") or 0) > 0:  # a LoRA actor's frozen base in bf16: its compute dtype
        if DTYPES.get(_get(node, f"{ARR}.actor.fsdp_config.model_dtype")) == "bf16":
            if _get(node, f"{ARR}.actor.fsdp_config.mixed_precision.param_dtype") == "auto":
                _set(node, f"{ARR}.actor.fsdp_config.mixed_precision.param_dtype", "bf16")
    if _get(node, "algorithm.rollout_correction.bypass_mode") is True:  # verl's apply_bypass_mode
        _set(node, f"{ARR}.actor.policy_loss.loss_mode", "bypass_mode")
    if _get(node, "data.seed") is None:
        _set(node, "data.seed", _get(node, "trainer.seed", 1))
    return node


def migrate_legacy_reward(node: dict) -> None:
    """verl's older ``custom_reward_function``, ``reward_model`` and ``sandbox_fusion``: each value set (non-null)
    moves into ``reward`` (the older wins, as in verl); the older sections stay, as given."""
    for old, new in LEGACY_REWARD.items():
        value = _get(node, old)
        if value is not None:
            _set(node, new, value)
    rollout = _get(node, "reward_model.rollout") or {}
    for key, value in rollout.items():
        if value is not None:
            _set(node, f"reward.reward_model.rollout.{key}", value)
    if _get(node, "custom_reward_function.path") is not None and _get(node, "custom_reward_function.name") is None:
        _set(node, "reward.custom_reward_function.name", "compute_score")


def _micro_batches(node: dict) -> None:
    """verl's global micro-batch keys: ``per_gpu = global ÷ workers``; setting both is an error (as in verl)."""
    workers = (_get(node, "trainer.n_gpus_per_node", 8) or 1) * (_get(node, "trainer.nnodes", 1) or 1)
    for global_key, per_gpu_key in GLOBAL_MICRO_BATCHES.items():
        total = _get(node, global_key)
        if total is None:
            continue
        explicit = _raw(node, per_gpu_key)
        if isinstance(explicit, int):  # an interpolated default (the critic's forward one) is not "set"
            raise ConfigError(f"{global_key}={total} and {per_gpu_key}={explicit}: set only one (verl's rule)")
        if not isinstance(total, int) or total % workers:
            raise ConfigError.invalid(
                global_key, total, f"must be a multiple of the {workers} workers it is split over"
            )
        _set(node, per_gpu_key, total // workers)


def _optimizers(node: dict) -> None:
    """``warmup_style`` is verl's older ``lr_scheduler_type``; a role's ``grad_clip`` and ``optim.clip_grad`` are
    one setting (whichever differs from 1.0; both, differently, is an error)."""
    for role in (f"{ARR}.actor", "critic"):
        style = _get(node, f"{role}.optim.warmup_style")
        if style is not None:
            _set(node, f"{role}.optim.lr_scheduler_type", style)
        grad_clip, clip_grad = _get(node, f"{role}.grad_clip", 1.0), _get(node, f"{role}.optim.clip_grad", 1.0)
        if grad_clip != 1.0 and clip_grad != 1.0 and grad_clip != clip_grad:
            raise ConfigError(
                f"{role}.grad_clip={grad_clip} and {role}.optim.clip_grad={clip_grad}: one setting under two names; "
                "set one of them"
            )
        value = grad_clip if grad_clip != 1.0 else clip_grad
        for key in (f"{role}.grad_clip", f"{role}.optim.clip_grad"):
            if _get(node, key) is not None:
                _set(node, key, value)


def _compute_dtype(node: dict, section: str) -> None:
    """verl's ``fsdp_config.dtype`` (its compute dtype, bfloat16 by default) sets ``mixed_precision.param_dtype``
    where that is auto: bfloat16 is what auto picks on CUDA (on a CPU auto computes in fp32)."""
    dtype = _get(node, f"{section}.dtype")
    if dtype is None or dtype == "bfloat16":
        return
    if dtype not in DTYPES:
        raise ConfigError.invalid(f"{section}.dtype", dtype, "must be bfloat16 or float32 (fp16 needs loss scaling)")
    if _get(node, f"{section}.mixed_precision.param_dtype", "auto") == "auto":
        _set(node, f"{section}.mixed_precision.param_dtype", DTYPES[dtype])


def _get(node: dict, key: str, default: Any = None) -> Any:
    """The value at dotted ``key`` (``default`` when absent), an interpolation resolved."""
    value: Any = node
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return default
        value = value[part]
    if isinstance(value, str) and "${" in value:  # rare: resolve it in a view of the whole config
        view = OmegaConf.select(OmegaConf.create(node), key, throw_on_resolution_failure=False)
        value = OmegaConf.to_container(view, resolve=True) if OmegaConf.is_config(view) else view
    return value


def _raw(node: dict, key: str) -> Any:
    """The value at ``key`` as written (an interpolation stays a string); None when absent."""
    value: Any = node
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _set(node: dict, key: str, value: Any) -> None:
    *parents, name = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[name] = value


def _delete(node: dict, key: str) -> None:
    *parents, name = key.split(".")
    for part in parents:
        node = node[part]
    node.pop(name)


def _is_empty(value: Any) -> bool:
    """A section without values (nested empty sections only)."""
    return isinstance(value, dict) and all(_is_empty(v) for v in value.values())
