"""verl's keys that ColoRL's schema does not declare, because nothing in ColoRL reads them; ``VerlPPOConfig``.

ColoRL's schema (``config.schema``, ``config.sections``) holds the keys ColoRL honours. verl's configuration has
more: subtrees of its machinery (``trees``) and typed keys of features ColoRL does not have. ``VERL_ONLY``
(``verl_only``) lists them, per core section, with verl's defaults. ``VerlPPOConfig`` is ColoRL's schema with them:
each core section that has verl-only keys, or nests a section that has, gets a frozen subclass adding them (its
nested sections swapped for theirs). The door's adapter (``load.VerlAdapter.schema``) has the loader compose, build
and check against it, so every verl key loads with its default; ``inert`` warns about, or refuses, a value set away
from it. ColoRL's code reads only the core sections' fields, which every subclass keeps, so its typing holds.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Callable
from typing import Any

from config import schema as core
from config.tree import InertTree
from verl_compat.cli.verl_only import VERL_ONLY, Keys

__all__ = ["VERL_ONLY", "Keys", "VerlPPOConfig", "door", "promote"]

_DOOR: dict[type, type] = {}  # a core section -> its subclass with verl's keys (itself where it needs none)


def door(cls: type) -> type:
    """``cls`` with the verl-only keys of ``VERL_ONLY`` added, to it and to the sections it nests (``cls`` itself
    where neither has any); made once, and named in this module (``Verl<Name>``, so that a config pickles)."""
    if cls not in _DOOR:
        _DOOR[cls] = _made(cls)
    return _DOOR[cls]


def _made(cls: type) -> type:
    hints = typing.get_type_hints(cls)
    swapped = [
        (f.name, _swapped(hints[f.name]), dataclasses.field(default_factory=_promoting(f, _swapped(hints[f.name]))))
        for f in dataclasses.fields(cls)
        if _swapped(hints[f.name]) is not hints[f.name]
    ]
    added = {}
    for base in reversed(cls.__mro__):  # a subclass's entry (RefFSDPConfig's) overrides its base's (FSDPConfig's)
        if base in VERL_ONLY:
            added |= {spec[0]: spec for spec in VERL_ONLY[base].fields}
    if not swapped and not added:
        return cls
    checks = [VERL_ONLY[base].check for base in cls.__mro__ if base in VERL_ONLY and VERL_ONLY[base].check]
    namespace = {"__post_init__": _post_init(cls, checks)} if checks else {}
    fields = {name: (name, tp, spec) for name, tp, spec in swapped}
    fields |= {name: _field(*spec) for name, spec in added.items()}  # a core key's own subtree grown (trainer.v1)
    made = dataclasses.make_dataclass(
        f"Verl{cls.__name__}",
        list(fields.values()),
        bases=(cls,),
        frozen=True,
        namespace={**namespace, "__doc__": f"``{cls.__name__}`` with verl's keys ColoRL does not read."},
    )
    made.__module__ = __name__
    made._overrides = frozenset(added) & {f.name for f in dataclasses.fields(cls)}  # type: ignore[attr-defined]
    globals()[made.__name__] = made
    return made


def _swapped(tp: Any) -> Any:
    """The door's type for annotation ``tp``: a section's subclass, a mapping of sections' (``teacher_models``)."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return door(tp)
    if typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
        key, value = typing.get_args(tp)
        return tp if door(value) is value else dict[key, door(value)]  # type: ignore[valid-type]
    return tp


def _field(name: str, tp: Any, default: Any = dataclasses.MISSING) -> tuple[str, Any, Any]:
    if isinstance(tp, type) and issubclass(tp, InertTree):
        return name, tp, dataclasses.field(default_factory=tp.default)
    if dataclasses.is_dataclass(tp) and default is dataclasses.MISSING:
        return name, tp, dataclasses.field(default_factory=tp)
    if isinstance(default, (list, dict)):
        return name, tp, dataclasses.field(default_factory=lambda: copy.deepcopy(default))
    return name, tp, dataclasses.field(default=default)


def _promoting(f: dataclasses.Field, tp: Any) -> Callable[[], Any]:
    """The default factory of a swapped field: the core default (``CriticConfig.optim``'s lr=1e-5 kept) as ``tp``."""
    if f.default_factory is not dataclasses.MISSING:
        return lambda: promote(f.default_factory(), tp)  # type: ignore[misc]
    return lambda: promote(f.default, tp)


def promote(value: Any, tp: Any) -> Any:
    """A core section's instance ``value`` as the door's type ``tp`` (its verl-only keys at their defaults)."""
    if isinstance(value, dict) and typing.get_origin(tp) is dict:
        return {name: promote(item, typing.get_args(tp)[1]) for name, item in value.items()}
    if not dataclasses.is_dataclass(value) or not isinstance(tp, type) or type(value) is tp:
        return value  # a value, or an interpolation ("${algorithm.rollout_correction}")
    hints, overrides = typing.get_type_hints(tp), getattr(tp, "_overrides", frozenset())
    return tp(
        **{
            f.name: promote(getattr(value, f.name), hints[f.name])
            for f in dataclasses.fields(value)
            if f.name not in overrides  # a core key whose subtree the door grows: the door's default
        }
    )


def _post_init(cls: type, checks: list[Callable[[Any], None]]) -> Callable[[Any], None]:
    own = getattr(cls, "__post_init__", None)

    def __post_init__(self: Any) -> None:
        if own is not None:
            own(self)
        for check in checks:
            check(self)

    return __post_init__


VerlPPOConfig: type[core.PPOConfig] = door(core.PPOConfig)
