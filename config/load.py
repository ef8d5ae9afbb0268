"""Loading ColoRL's configuration: compose with Hydra, build the typed config, check what spans components.

``compose_config`` composes ``conf/<name>.yaml`` and the command-line overrides on top of the schema's defaults
(the adapter's ``schema``: ``config.schema.PPOConfig`` unless a dialect declares more keys), then builds the
frozen, fully resolved config: every key is checked against the schema (unknown keys, types, ``Literal`` choices,
each component's ranges). The batch arithmetic is checked one layer up, by computing the step plan
(``planner.load_config``). Every problem is a ``ConfigError`` whose message names the full key, the value and what
is valid, e.g. ``data.train_batch_size=0: must be a positive integer``.

Which preset: a command line that names a model or data (``actor_rollout_ref.model.path``, ``data.train_files``)
runs on ``conf/ppo_trainer.yaml``, the schema's defaults alone, so a command line written against those defaults
means the same here; one that names neither runs the built-in offline demo, ``conf/demo.yaml``. ``--config-name``
picks one explicitly.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from config import engine
from config.adapter import Adapter, installed
from config.checks import ConfigError, is_int, is_number
from config.schema import PPOConfig
from config.tree import InertTree, plain

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
FULL_PRESET, DEMO_PRESET = "ppo_trainer", "demo"
USER_ASSET_KEYS = ("actor_rollout_ref.model.path", "data.train_files")  # naming one of these leaves the demo
T = TypeVar("T")

SCHEMA_NODE = "ppo_config_schema"  # the presets' base (conf/*.yaml's defaults list)
_stored: list[type | None] = [None]  # the schema whose defaults Hydra's ConfigStore holds now


def store_schema(adapter: Adapter | None = None) -> None:
    """Put the defaults of ``adapter``'s schema (default: the installed adapter's) in Hydra's ConfigStore as
    ``ppo_config_schema``, the base the YAML presets and overrides go on top of; composing does it first."""
    schema = (adapter or installed()).schema()
    if _stored[0] is not schema:
        ConfigStore.instance().store(name=SCHEMA_NODE, node=_defaults(schema))
        _stored[0] = schema


@functools.cache
def _defaults(schema: type) -> dict:
    return plain(dataclasses.asdict(schema()))


store_schema()  # for Hydra's own composing (a preset composed by name); the door's install stores its schema


def preset_for(overrides: Sequence[str]) -> str:
    """The schema's defaults when the overrides name a model or data, else the built-in demo."""
    keys = {override.lstrip("+~").partition("=")[0] for override in overrides}
    return FULL_PRESET if keys & set(USER_ASSET_KEYS) else DEMO_PRESET


def split_command_line(args: Sequence[str], adapter: Adapter | None = None) -> tuple[str, list[str], bool]:
    """``python main.py``'s arguments as (preset, the other arguments, whether Hydra's application must answer).

    The preset is the one named (``--config-name``/``-cn``), else ``preset_for`` the overrides; ``adapter``
    (default: the installed one, ``config.adapter``) moves older key paths to the schema's. Hydra's own arguments
    (flags such as ``--help``, ``--cfg job``, ``-m``, and ``hydra.*`` keys) need Hydra's application; without them
    the overrides are composed by ``compose_config``.
    """
    config_name, overrides = None, []
    rest = iter(args)
    for arg in rest:
        if arg in ("--config-name", "-cn"):
            config_name = next(rest, None)
        elif arg.startswith("--config-name="):
            config_name = arg.partition("=")[2]
        else:
            overrides.append(arg)
    adapter = adapter or installed()
    overrides = adapter.overrides(overrides)
    hydra_app = any(arg.startswith("-") or arg.lstrip("+~").startswith("hydra.") for arg in overrides)
    if hydra_app:  # Hydra's application composes on the schema's defaults
        store_schema(adapter)
    return config_name or preset_for(overrides), overrides, hydra_app


def compose_config(
    overrides: Sequence[str] = (), config_name: str | None = None, adapter: Adapter | None = None
) -> PPOConfig:
    """The typed config of ``conf/<config_name>.yaml`` (default: ``preset_for(overrides)``) with Hydra-style
    ``overrides`` (``["data.train_batch_size=8"]``; another dialect's keys through ``adapter``, default the
    installed one), checked against the schema. The batch arithmetic spans components: the step planner checks it
    (``planner.load_config``)."""
    adapter = adapter or installed()
    schema = adapter.schema()
    overrides = [_plain_if_known(o, schema) for o in adapter.overrides(overrides)]
    store_schema(adapter)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            composed = compose(config_name=config_name or preset_for(overrides), overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise _composition_error(exc, schema) from exc
    finally:  # a preset composed by name later (the run report's) is the installed adapter's again
        store_schema()
    return to_config(composed, adapter)


def _plain_if_known(override: str, schema: type) -> str:
    """``+key=value`` for a key the schema has is ``key=value`` (scripts add with + some keys the schema has)."""
    if override.startswith("+") and not override.startswith("++"):
        key = override[1:].partition("=")[0]
        parent, _, name = key.rpartition(".")
        holder = _schema_type(parent, schema) if parent else schema
        known = name in holder if isinstance(holder, dict) else _schema_type(key, schema) is not None
        if known:
            return override[1:]
    elif not override.startswith(("+", "~")):  # a key of a free-form section (engine_kwargs.vllm.x) is added
        holder = _schema_type(override.partition("=")[0].rpartition(".")[0], schema)
        if holder == {} or typing.get_origin(holder) is dict:
            return "++" + override  # add, or replace what a preset set
    return override


def to_config(node: DictConfig | Mapping, adapter: Adapter | None = None, *, announce: bool = True) -> PPOConfig:
    """Build the typed ``PPOConfig`` from a composed config (interpolations resolved, every value checked; the
    tree translated and the result checked by ``adapter``, default the installed one). ``announce``: print which
    engine ``rollout.name=auto`` chose (false for a config that is only compared, never run)."""
    adapter = adapter or installed()
    cfg = _engine_chosen(_built(node, adapter), announce)
    adapter.check(cfg)
    return cfg


def _engine_chosen(cfg: PPOConfig, announce: bool) -> PPOConfig:
    """``cfg`` with ``rollout.name=auto`` replaced by the engine ``config.engine.choose`` picks, said once when
    ``announce``."""
    if cfg.actor_rollout_ref.rollout.name != "auto":
        return cfg
    device = resolve_device(cfg) if engine.vllm_installed() else "cpu"  # without vLLM no device matters
    name, why = engine.choose(cfg, device)
    if announce:
        engine.say(name, why)
    return replace_keys(cfg, {"actor_rollout_ref.rollout.name": name})


def _built(node: DictConfig | Mapping, adapter: Adapter) -> PPOConfig:
    """The config of ``node``: the adapter's older spellings moved, interpolations resolved once, then built
    from plain containers (reading a DictConfig node by node costs more than the rest of the start-up)."""
    written = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else plain(dict(node))
    try:
        resolved = OmegaConf.to_container(OmegaConf.create(adapter.tree(written)), resolve=True)
    except OmegaConfBaseException as exc:  # e.g. an interpolation that does not resolve
        message = str(exc).splitlines()[0]
        raise ConfigError(f"{exc.full_key}: {message}" if exc.full_key else message) from exc
    return _build(adapter.schema(), resolved, "")


def replace_keys(cfg: T, updates: Mapping[str, Any]) -> T:
    """A copy of the frozen ``cfg`` with dotted keys replaced (``{"trainer.device": "cpu"}``); checks rerun."""
    direct = {k: v for k, v in updates.items() if "." not in k}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in updates.items():
        if "." in key:
            head, _, rest = key.partition(".")
            nested.setdefault(head, {})[rest] = value
    for head, sub in nested.items():
        direct[head] = replace_keys(getattr(cfg, head), sub)
    return dataclasses.replace(cfg, **direct)  # type: ignore[type-var]


def _build(cls: type, node: Mapping, path: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in node.keys():
        if key not in names:
            raise ConfigError(_unknown_key_message(_join(path, str(key)), cls))
    kwargs = {name: _typed(cls, hints[name], node[name], _join(path, name)) for name in names if name in node}
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise (exc.under(path) if path else exc) from None


def _typed(owner: type, tp: Any, value: Any, key: str) -> Any:
    """``value`` (read from the composed config, so resolved) checked against the annotation ``tp``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if isinstance(tp, type) and issubclass(tp, InertTree):
        if not isinstance(value, Mapping):
            raise ConfigError.invalid(key, value, "expected a config group, not a value")
        return tp.checked(value, key)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError.invalid(key, value, "expected a mapping of keys to values")
        if dataclasses.is_dataclass(args[1]):  # named entries of one kind (distillation.teacher_models.<name>)
            return {str(name): _build(args[1], value[name], f"{key}.{name}") for name in value}
        return value  # free-form (model.override_config, data.apply_chat_template_kwargs)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError.invalid(key, value, "expected a config group, not a value")
        return _build(tp, value, key)
    if origin in (Union, types.UnionType):  # Optional[X], X | None
        return None if value is None else _typed(owner, next(a for a in args if a is not type(None)), value, key)
    if origin is Literal:
        if value not in args:
            hint = getattr(owner, "choice_hints", {}).get(key.rpartition(".")[2])
            raise ConfigError.invalid(key, value, f"must be one of {', '.join(args)}" + (f" ({hint})" if hint else ""))
        return value
    if origin in (list, list):
        if isinstance(value, str):  # a single name is a list of it (trainer.logger=console)
            value = [value]
        if not isinstance(value, list):
            raise ConfigError.invalid(key, value, f"expected {_type_name(tp)}")
        return [_typed(owner, args[0], item, f"{key}[{i}]") for i, item in enumerate(value)]
    if tp is Any:
        return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value
    return _scalar(tp, value, key)


def _scalar(tp: type, value: Any, key: str) -> Any:
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and is_int(value):
        return value
    if tp is float and is_number(value):
        return float(value)
    if tp is str and (isinstance(value, str) or is_number(value)):
        return str(value)
    raise ConfigError.invalid(key, value, f"expected {_type_name(tp)}")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _composition_error(exc: BaseException, schema: type) -> ConfigError:
    """Turn Hydra's 'Could not override ...' / OmegaConf's errors into a one-line ConfigError."""
    if isinstance(exc, OverrideParseException) and exc.override:
        return ConfigError(_unparsed_override_message(exc.override, exc.message))
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and cause.full_key:
        parent = cause.full_key.rpartition(".")[0]
        return ConfigError(_unknown_key_message(cause.full_key, _schema_type(parent, schema) if parent else schema))
    lines = [ln for ln in str(exc).splitlines() if ln.strip() and not ln.startswith("See http")]
    return ConfigError(": ".join(lines[:2]))


def _unparsed_override_message(override: str, message: str) -> str:
    """An override Hydra's grammar cannot parse (``key=~/path``): what stopped it, and the value quoted (Hydra reads
    a quoted value as a plain string; the outer single quotes keep the double ones from the shell)."""
    first, _, rest = message.partition("\n")
    lexer = "LexerNoViableAltException: "
    if first.startswith(lexer):  # the caret under the override marks the character it stopped at
        at = rest.splitlines()[0].find("^") - len(lexer) if rest else -1
        why = f"{override[at]!r} cannot stand unquoted in a value" if 0 <= at < len(override) else "cannot be read"
    else:
        why = first
    key, sep, value = override.partition("=")
    fix = f"; quote the value: '{key}=\"{value}\"'" if sep and '"' not in value else ""
    return f"{override}: {why} (Hydra's override grammar){fix}"


def _unknown_key_message(full_key: str, schema: Any) -> str:
    """``full_key`` is not a key of ``schema``, the type (or an inert subtree's defaults) of its parent key."""
    parent, _, _ = full_key.rpartition(".")
    where = f"under {parent}" if parent else "top-level keys"
    if dataclasses.is_dataclass(schema):
        valid = ", ".join(f.name for f in dataclasses.fields(schema))
    else:
        valid = ", ".join(schema) if isinstance(schema, dict) and schema else "none"
    return f"unknown config key {full_key!r} (valid {where}: {valid})"


def _schema_type(full_key: str, schema: type) -> Any:
    """The annotated type of ``full_key`` in ``schema`` (inside inert subtrees: their defaults); None if unknown."""
    tp: Any = schema
    for part in full_key.split("."):
        if isinstance(tp, type) and issubclass(tp, InertTree):
            tp = tp.DEFAULTS
        if isinstance(tp, dict):
            tp = tp.get(part)
            continue
        if not dataclasses.is_dataclass(tp) or part not in typing.get_type_hints(tp):
            return None
        tp = typing.get_type_hints(tp)[part]
    return tp.DEFAULTS if isinstance(tp, type) and issubclass(tp, InertTree) else tp


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (list, list):
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    return "null" if tp is type(None) else tp.__name__


def resolve_device(cfg: PPOConfig) -> str:
    """trainer.device as a concrete "cuda" or "cpu" ("auto" picks CUDA when a device is visible)."""
    import torch  # here, not above: loading a config (and reporting its mistakes) imports no torch

    requested = cfg.trainer.device
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return "cpu"
    if not torch.cuda.is_available():
        raise ConfigError(
            "trainer.device='cuda': no CUDA device is visible (torch.cuda.is_available() is False); "
            "use trainer.device=cpu"
        )
    visible, wanted = torch.cuda.device_count(), cfg.trainer.n_gpus_per_node
    if cfg.trainer.nnodes == 1 and wanted > visible:
        raise ConfigError(f"trainer.n_gpus_per_node={wanted}: only {visible} CUDA device(s) are visible")
    return "cuda"
