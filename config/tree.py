"""Subtrees kept as given, and flattening configs.

An ``InertTree`` is a subtree of keys whose ``DEFAULTS`` are its one home: another trainer's subtrees a
command-line dialect's schema declares (``config.adapter.Adapter.schema``), or a free-form section such as the
trainer modes (``config.machinery``). The loader checks a user's keys against the defaults (an unknown key is an
error naming the valid ones, as for typed sections) and keeps the values as given.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from config.checks import ConfigError

ARR = "actor_rollout_ref"  # the section of the policy's three roles, the prefix of most keys


class InertTree(dict):
    """A plain ``dict`` (so ``dataclasses.asdict`` and Hydra see a nested mapping) of a subtree kept as given."""

    DEFAULTS: ClassVar[dict[str, Any]] = {}
    OPEN: ClassVar[bool] = False  # True: keys beyond DEFAULTS are taken too (a free-form section, Ray's runtime_env)

    @classmethod
    def default(cls) -> InertTree:
        return cls(copy.deepcopy(cls.DEFAULTS))

    @classmethod
    def checked(cls, value: Mapping, key: str) -> InertTree:
        """``value`` (a resolved mapping) with its keys checked against ``DEFAULTS``; ConfigError names the key."""
        if not cls.OPEN:
            _check_keys(value, cls.DEFAULTS, key)
        return cls(copy.deepcopy(dict(value)))


def _check_keys(value: Any, defaults: Any, key: str) -> None:
    if not isinstance(defaults, dict) or not defaults:  # a leaf, or a free-form {} (engine kwargs)
        return
    if not isinstance(value, Mapping):
        raise ConfigError.invalid(key, value, "expected a config group, not a value")
    for name, item in value.items():
        if name not in defaults:
            valid = ", ".join(defaults)
            raise ConfigError(f"unknown config key {f'{key}.{name}'!r} (valid under {key}: {valid})")
        _check_keys(item, defaults[name], f"{key}.{name}")


def flat(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf under ``value``: a config's dataclasses and nested mappings (inert
    subtrees, ``dataclasses.asdict``'s); an empty mapping is a leaf. The one flattener of configs."""
    if dataclasses.is_dataclass(value):
        items: Iterator[tuple[str, Any]] = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    elif isinstance(value, Mapping) and value:
        items = iter(value.items())
    else:
        yield prefix, value
        return
    for name, item in items:
        yield from flat(item, f"{prefix}.{name}" if prefix else str(name))


def plain(value: Any) -> Any:
    """``value`` with every mapping a plain ``dict`` (OmegaConf takes no ``dict`` subclass), e.g. of ``asdict``."""
    if isinstance(value, Mapping):
        return {name: plain(item) for name, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
