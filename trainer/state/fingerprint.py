"""What may change when a run resumes from a checkpoint, and what may not.

Every checkpoint records the resolved config it was saved with (``config_record``, in ``driver.pt``). On resume
``check_resume`` compares it with the current one, key by key:

- ``MAY_CHANGE``: how long and how often (steps, epochs, frequencies), where and how it logs and saves, what counts
  as a failure, and where and how the work runs (workers, micro-batches, offloading, kernels, validation): free;
- ``OPTIMIZER``: the optimizer's hyper-parameters: the new values are applied from the next update (the optimizer's
  moments and the schedule's step are kept: ``workers.checkpoint.shards.load_role``) and each change is printed;
- everything else (the model and its architecture, the data, the batch arithmetic, the algorithm): refused in one
  line that lists the differing keys, unless ``trainer.resume_accept_changes`` names them (or a prefix of them).

A key the record lacks (new in the schema since the checkpoint was saved) counts as changed only when it is away
from its default; keys recorded under an older place are compared at their current one (``config.adapter``).

docs/reliability.md ("Resuming with a changed config") lists the same keys.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import Any

from config import ConfigError, PPOConfig
from config.adapter import installed
from config.tree import flat
from planner.worker_roles import ROLES

MAY_CHANGE = (
    "trainer.total_epochs",
    "trainer.total_training_steps",
    "trainer.max_wall_time_s",
    "trainer.test_freq",
    "trainer.save_freq",
    "trainer.val_before_train",
    "trainer.logger",
    "trainer.project_name",
    "trainer.experiment_name",
    "trainer.default_local_dir",
    "trainer.default_hdfs_dir",
    "trainer.max_*_ckpt_to_keep",
    "trainer.resume_*",
    "trainer.max_nonfinite_steps",
    "trainer.phase_timeout_s",
    "trainer.stop_grace_s",
    "trainer.max_restarts",
    "trainer.device",
    "trainer.n_gpus_per_node",
    "actor_rollout_ref.rollout.n_gpus_per_node",  # follows trainer.n_gpus_per_node (an elastic resume)
    "trainer.nnodes",
    "trainer.deterministic",
    "trainer.use_ray",  # where the one worker runs: the same computation (trainer.running.groups)
    "trainer.use_legacy_worker_impl",
    "ray_kwargs.*",
    "*micro_batch_size*",
    "*max_token_len*",
    "*use_dynamic_bsz",
    "*.fsdp_config.*",
    "critic.fsdp.*",
    "*profiler.*",
    "trainer.balance_batch",
    "trainer.log_val_generations",
    "trainer.*_data_dir",
    "trainer.val_only",
    "*.enable_gradient_checkpointing",
    "*.use_remove_padding",
    "*.use_fused_kernels",  # the same log-probs, computed from hidden states in chunks
    "*.use_torch_compile",
    "*.compile_model",
    "actor_rollout_ref.model.use_shm",
    "data.val_*",
    "data.return_raw_chat",
    "builtin.num_val",
    "builtin.cache_dir",
    "actor_rollout_ref.rollout.val_kwargs.*",
    "actor_rollout_ref.rollout.name",
    "actor_rollout_ref.rollout.mode",
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.load_format",
    "actor_rollout_ref.rollout.layered_summon",
    "actor_rollout_ref.rollout.max_*",
    "actor_rollout_ref.rollout.enforce_eager",
    "actor_rollout_ref.rollout.free_cache_engine",
    "actor_rollout_ref.rollout.enable_chunked_prefill",
    # dynamic sampling's cap only decides when a step gives up: raising it after a failure and resuming is the fix
    "algorithm.filter_groups.max_num_gen_batches",
    "algorithm.filter_groups.max_inflight_gen_batches",
    "distillation.n_gpus_per_node",  # a teacher pool of its own: the teacher is colocated
    "distillation.nnodes",
    "distillation.teacher_models.*.num_replicas",
    "distillation.teacher_models.*.inference.*",
)
OPTIMIZER = ("actor_rollout_ref.actor.optim.*", "critic.optim.*")
# A model's shape: compared between the checkpoint's config.json and the model it would be loaded into.
ARCHITECTURE = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)
_MISSING = object()
_UNSET = "<not recorded>"  # a key the checkpoint's config did not have


def config_record(cfg: PPOConfig) -> dict[str, Any]:
    """``cfg`` as {dotted key: plain value}: what a checkpoint records (loadable with ``weights_only``)."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in flat(cfg)}


def _matches(key: str, patterns: Any) -> bool:
    return any(key == p or key.startswith(f"{p}.") or fnmatch.fnmatchcase(key, p) for p in patterns)


def check_resume(saved: dict[str, Any] | None, cfg: PPOConfig, checkpoint: Path) -> list[str]:
    """Raise ConfigError when ``cfg`` differs from ``saved`` (the checkpoint's record) where it must not; else the
    lines to print: each optimizer change applied, each change accepted by ``trainer.resume_accept_changes``."""
    if saved is None:  # written before checkpoints recorded their config
        return [f"warning: {checkpoint} records no config (an older ColoRL's): resuming without comparing configs"]
    saved, current = _in_current_places(saved), config_record(cfg)
    changed = {
        key: (saved[key], current[key])
        for key in sorted(saved.keys() & current.keys())
        if saved[key] != current[key] and not _matches(key, MAY_CHANGE)
    }
    changed |= {key: change for key, change in _new_keys_set(saved, current).items() if not _matches(key, MAY_CHANGE)}
    changed |= _architecture_changes(cfg, checkpoint)
    accepted = cfg.trainer.resume_accept_changes
    refused = {k: v for k, v in changed.items() if not _matches(k, OPTIMIZER) and not _matches(k, accepted)}
    if refused:
        raise ConfigError(
            f"cannot resume from {checkpoint}: it was saved with a different config: {_listed(refused)}. Resume with "
            "the values it was saved with, start afresh in another trainer.default_local_dir, or accept the change "
            f"with trainer.resume_accept_changes=[{','.join(refused)}]"
        )
    return [
        f"resuming with {key} changed: {_shown(old)} -> {_shown(new)} ("
        + (
            "applied from the next update; the optimizer's moments and the schedule's step are kept)"
            if _matches(key, OPTIMIZER)
            else "accepted by trainer.resume_accept_changes)"
        )
        for key, (old, new) in changed.items()
    ]


def _in_current_places(saved: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's record with the keys that have moved since it was saved in their current places
    (the installed adapter's ``current_place``, ``config.adapter``: ``ray_init.*``, ``critic.fsdp_config.*``, the
    top-level reward sections). A null older value moves nothing, and a record that has the
    current place too keeps that."""
    moved = {}
    for key, value in saved.items():
        place = installed().current_place(key)
        if place == key or (place not in saved and value is not None):
            moved[place] = value
    return moved


def _new_keys_set(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """key -> (unset, value) for each key the checkpoint's record lacks (new in the schema since it was saved)
    whose value is not the schema's default; a new key at its default does not change the run."""
    defaults, changes = config_record(installed().schema()()), {}
    for key in sorted(current.keys() - saved.keys()):
        if installed().current_place(key) != key:  # an older spelling: its current place is compared
            continue
        default = defaults.get(key, _MISSING)
        if isinstance(default, str) and default.startswith("${"):  # it follows another key (or an oc.select)
            default = current.get(default[2:-1], _MISSING) if re.fullmatch(r"\$\{[\w.]+\}", default) else current[key]
        if current[key] != default:
            changes[key] = (_UNSET, current[key])
    return changes


def _architecture_changes(cfg: PPOConfig, checkpoint: Path) -> dict[str, tuple[Any, Any]]:
    """``<model key>.architecture.<field>`` -> (saved, current) for each role model whose shape changed."""
    from transformers import AutoConfig  # deferred: only a resume needs it

    changes = {}
    for role in (role for role in ROLES if role.trained):  # their checkpoints' directories are their names
        key, model = role.model, role.model_config(cfg)
        saved_dir = checkpoint / role.name
        if not (saved_dir / "config.json").is_file() or not model.path or not os.path.isdir(model.path):
            continue
        saved = AutoConfig.from_pretrained(saved_dir, trust_remote_code=model.trust_remote_code)
        current = AutoConfig.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
        for field in ARCHITECTURE:
            old, new = getattr(saved, field, _MISSING), getattr(current, field, _MISSING)
            if _MISSING not in (old, new) and old != new:
                changes[f"{key}.architecture.{field}"] = (old, new)  # config.json's, under the model's key
    return changes


def _listed(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{key} {_shown(old)} -> {_shown(new)}" for key, (old, new) in changes.items())


def _shown(value: Any) -> str:
    text = (
        "null" if value is None else value if value is _UNSET else repr(value) if isinstance(value, str) else str(value)
    )
    return text if len(text) <= 80 else f"{text[:77]}..."
