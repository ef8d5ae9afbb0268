"""Loading and validating ColoRL's configuration: compose, type-check, build, cross-check.

``load_config`` composes ``conf/<name>.yaml`` with Hydra overrides on top of the schema
(``trainer.config_schema``: one dataclass per component, the home of every default), builds the dataclasses
(each checks its own fields) and then checks what spans components: the batch arithmetic that must hold
before Ray starts. Every problem is a ``ConfigError`` whose message names the full key, the value and what is
valid, e.g. ``data.train_batch_size=0: must be a positive integer``.
"""

from __future__ import annotations

import typing
import warnings
from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, List, Union

import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from trainer.config_checks import ConfigError, is_int
from trainer.config_schema import ActorConfig, CriticConfig, PPOConfig
from trainer.core_algos import ADV_ESTIMATORS, estimator_needs_critic

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def to_dataclass(cfg: DictConfig) -> PPOConfig:
    """Build the typed ``PPOConfig`` from a composed config, running every component's ``__post_init__``."""
    try:
        return _build(PPOConfig, cfg, "")
    except OmegaConfBaseException as exc:  # e.g. an interpolation that does not resolve
        message = str(exc).splitlines()[0]
        raise ConfigError(f"{exc.full_key}: {message}" if exc.full_key else message) from exc


def _build(cls: type, node: DictConfig, path: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    for key in node.keys():
        if key not in names:
            raise ConfigError(_unknown_key_message(f"{path}.{key}" if path else str(key)))
    kwargs: dict[str, Any] = {}
    for name in names:
        value = node[name]  # resolves interpolations
        if is_dataclass(hints[name]):
            value = _build(hints[name], value, f"{path}.{name}" if path else name)
        elif isinstance(value, ListConfig):
            value = OmegaConf.to_container(value, resolve=True)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise (exc.under(path) if path else exc) from None


def load_config(overrides: Sequence[str] = (), config_name: str = "ppo_trainer") -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` (a preset such as ``qwen2_5_0_5b_gsm8k``) with Hydra-style ``overrides``
    (``["data.train_batch_size=8"]``) and validate it (components and batch arithmetic for ``num_workers(cfg)``
    workers)."""
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise _composition_error(exc) from exc
    validate_config(cfg, num_workers(cfg))
    return cfg


def _composition_error(exc: BaseException) -> ConfigError:
    """Turn Hydra's 'Could not override ...' / OmegaConf's type errors into a one-line ConfigError."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and cause.full_key:
        return ConfigError(_unknown_key_message(cause.full_key))
    if isinstance(cause, ValidationError) and cause.full_key:
        expected = _type_name(_schema_type(cause.full_key))
        return ConfigError.invalid(cause.full_key, cause.value, f"expected {expected}")
    lines = [ln for ln in str(exc).splitlines() if ln.strip() and not ln.startswith("See http")]
    return ConfigError(": ".join(lines[:2]))


def _unknown_key_message(full_key: str) -> str:
    parent, _, _ = full_key.rpartition(".")
    schema = _schema_type(parent) if parent else PPOConfig
    where = f"under {parent}" if parent else "top-level keys"
    valid = ", ".join(f.name for f in fields(schema)) if is_dataclass(schema) else "none"
    return f"unknown config key {full_key!r} (valid {where}: {valid})"


def _schema_type(full_key: str) -> Any:
    """The annotated type of ``full_key`` in the schema (list items by ``key[i]``); None when unknown."""
    tp: Any = PPOConfig
    for part in full_key.split("."):
        name = part.split("[")[0]
        if not is_dataclass(tp) or name not in typing.get_type_hints(tp):
            return None
        tp = typing.get_type_hints(tp)[name]
        if "[" in part:  # an item of a list field
            tp = (typing.get_args(tp) or (Any,))[0]
    return tp


def _type_name(tp: Any) -> str:
    if tp is None or tp is Any:
        return "another type"
    if is_dataclass(tp):
        return "a config group, not a value"
    if typing.get_origin(tp) is Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (list, List):
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    return "null" if tp is type(None) else tp.__name__


# ----------------------------------------------------------------------------------- cross-field checks


def num_workers(cfg: Any) -> int:
    """Worker processes (one per GPU, or per CPU slot on CPU): ``n_gpus_per_node × nnodes``."""
    return cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes


def uses_critic(cfg: Any) -> bool:
    """critic.enable, or when it is null, whether the advantage estimator needs values."""
    enable = cfg.critic.enable
    return estimator_needs_critic(cfg.algorithm.adv_estimator) if enable is None else bool(enable)


def validate_config(cfg: DictConfig | PPOConfig, n_workers: int) -> None:
    """Check every component, then the batch arithmetic the ``n_workers`` data-parallel workers rely on."""
    conf = cfg if isinstance(cfg, PPOConfig) else to_dataclass(cfg)
    if not is_int(n_workers) or n_workers < 1:
        raise ConfigError(f"n_workers={n_workers}: must be a positive integer")
    data, rollout, actor, critic = conf.data, conf.actor_rollout_ref.rollout, conf.actor_rollout_ref.actor, conf.critic
    workers = f"{n_workers} workers (trainer.n_gpus_per_node × trainer.nnodes)"
    sequences = data.train_batch_size * rollout.n
    if sequences % n_workers:
        raise ConfigError(
            f"data.train_batch_size={data.train_batch_size} × actor_rollout_ref.rollout.n={rollout.n} = {sequences} "
            f"sequences per step cannot be split evenly across {workers}; make the product a multiple of {n_workers}"
        )
    _check_estimator(conf)
    _check_mini_batches("actor_rollout_ref.actor", actor, ("actor_rollout_ref.rollout.n", rollout.n),
                        data.train_batch_size, n_workers)
    if uses_critic(conf):
        _check_mini_batches("critic", critic, ("critic.rollout_n", critic.rollout_n), data.train_batch_size, n_workers)


def _check_mini_batches(
    prefix: str, role: ActorConfig | CriticConfig, n: tuple[str, int], train_batch_size: int, n_workers: int
) -> None:
    """mini | train_batch_size;  per-worker mini = mini·n / n_workers ∈ ℕ;  min(micro, it) | per-worker mini."""
    (n_key, n_value), mini, micro = n, role.ppo_mini_batch_size, role.ppo_micro_batch_size_per_gpu
    mini_text = f"{prefix}.ppo_mini_batch_size={mini}"
    if train_batch_size % mini:
        raise ConfigError(f"{mini_text}: must divide data.train_batch_size={train_batch_size} (both count prompts)")
    per_worker, remainder = divmod(mini * n_value, n_workers)
    if remainder:
        raise ConfigError(f"{mini_text} × {n_key}={n_value} = {mini * n_value} sequences per mini-batch cannot be "
                          f"split evenly across {n_workers} workers")
    if not role.use_dynamic_bsz and per_worker % min(micro, per_worker):  # a larger micro-batch is the mini-batch
        raise ConfigError(f"{prefix}.ppo_micro_batch_size_per_gpu={micro}: must divide the {per_worker} sequences "
                          f"of each worker's mini-batch ({mini_text} × {n_key}={n_value} / {n_workers} workers)")


def _check_estimator(conf: PPOConfig) -> None:
    estimator, n = conf.algorithm.adv_estimator, conf.actor_rollout_ref.rollout.n
    if "index" in ADV_ESTIMATORS[estimator].needs and n < 2:  # the baseline comes from the prompt's group
        raise ConfigError(f"actor_rollout_ref.rollout.n={n}: algorithm.adv_estimator={estimator} compares the "
                          "responses to one prompt, so it needs rollout.n > 1")
    needs_critic = estimator_needs_critic(estimator)
    if conf.critic.enable is False and needs_critic:
        raise ConfigError(f"critic.enable=false: algorithm.adv_estimator={estimator} needs a critic's values; "
                          "set critic.enable=true or null")
    if conf.critic.enable is True and not needs_critic:
        warnings.warn(f"critic.enable=true but algorithm.adv_estimator={estimator} does not use values; "
                      "the critic will be trained for nothing", stacklevel=3)


def resolve_device(cfg: Any) -> str:
    """trainer.device as a concrete "cuda" or "cpu" ("auto" picks CUDA when a device is visible)."""
    requested = cfg.trainer.device
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return "cpu"
    if not torch.cuda.is_available():
        raise ConfigError("trainer.device='cuda': no CUDA device is visible (torch.cuda.is_available() is False); "
                          "use trainer.device=cpu")
    visible, wanted = torch.cuda.device_count(), cfg.trainer.n_gpus_per_node
    if cfg.trainer.nnodes == 1 and wanted > visible:
        raise ConfigError(f"trainer.n_gpus_per_node={wanted}: only {visible} CUDA device(s) are visible")
    return "cuda"
