"""``@register``: mark a worker method as a worker-group method, with how its calls are dispatched and collected.

``register`` only *records* the modes on the method (under ``MAGIC_ATTR``). A worker group reads the record
when it is built (``registered_methods`` here, ``single_controller/base/worker_group.py`` there) and makes each
marked method a group method: dispatch -> execute on the ranks -> wait -> collect.

A mode's functions are found in a registry keyed by the mode's value (``add_dispatch_mode``): the core's modes,
``Dispatch.ONE_TO_ALL`` and ``Dispatch.DP_COMPUTE_PROTO`` (and ``ALL_TO_ALL``, the default), are registered here
with their functions from single_controller/base/dispatch.py. Other modes register themselves under their own
values; an enum whose members carry those values names them (a member is looked up by its value).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from enum import Enum
from typing import Any

from single_controller.base.dispatch import (
    collect_all_to_all,
    collect_dp_compute_data_proto,
    dispatch_all_to_all,
    dispatch_dp_compute_data_proto,
    dispatch_one_to_all,
)
from single_controller.future import DataProtoFuture

MAGIC_ATTR = (
    "_colorl_register"  # the attribute @register sets on a method: {"dispatch_mode", "execute_mode", "blocking"}
)


class Dispatch(Enum):
    """The core's ways to spread a call's arguments over the ranks of a worker group."""

    ONE_TO_ALL = "one_to_all"  # every rank gets the same arguments
    DP_COMPUTE_PROTO = "dp_compute_proto"  # DataProto arguments are chunked over ranks, results concatenated
    ALL_TO_ALL = "all_to_all"  # @register's default: arguments pass through; per-rank lists are split by execute


class Execute(Enum):
    ALL = "all"  # run on every rank
    RANK_ZERO = "rank_zero"  # run on rank 0 only and return its single result


DISPATCH_MODE_FNS: dict[str, dict[str, Callable]] = {}  # mode's value -> {"dispatch_fn", "collect_fn"}

# Modes that pad their DataProto arguments and whose result the group trims back. DP modes pad to a
# multiple of world_size, MEGATRON_COMPUTE_PROTO to one of dp_size: dp_size divides world_size, so
# whenever the latter pads the group's world-size check sees padding too and trims.
PADDED_MODES: set[str] = set()  # their values


def add_dispatch_mode(mode: Enum, dispatch_fn: Callable, collect_fn: Callable, padded: bool = False) -> None:
    """Register ``mode``'s functions under its value (``padded``: it pads DataProto arguments, and the group trims
    the result)."""
    if mode.value in DISPATCH_MODE_FNS:
        raise ValueError(f"{mode} has dispatch functions already")
    DISPATCH_MODE_FNS[mode.value] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}
    if padded:
        PADDED_MODES.add(mode.value)


add_dispatch_mode(Dispatch.ONE_TO_ALL, dispatch_one_to_all, collect_all_to_all)
add_dispatch_mode(Dispatch.DP_COMPUTE_PROTO, dispatch_dp_compute_data_proto, collect_dp_compute_data_proto, padded=True)
add_dispatch_mode(Dispatch.ALL_TO_ALL, dispatch_all_to_all, collect_all_to_all)


def is_padded(dispatch_mode: Enum | dict) -> bool:
    """Whether ``dispatch_mode`` pads its DataProto arguments (a custom mode names its own ``pad_divisor``)."""
    return isinstance(dispatch_mode, Enum) and dispatch_mode.value in PADDED_MODES


def get_dispatch_fns(dispatch_mode: Enum | dict) -> dict[str, Callable]:
    """The ``{"dispatch_fn", "collect_fn"}`` pair of a mode (custom modes are such a dict already)."""
    if isinstance(dispatch_mode, dict):
        return dispatch_mode
    if dispatch_mode.value not in DISPATCH_MODE_FNS:
        raise NotImplementedError(f"{dispatch_mode} has no dispatch functions in this worker group")
    return DISPATCH_MODE_FNS[dispatch_mode.value]


def _check_modes(dispatch_mode, execute_mode) -> None:
    if isinstance(dispatch_mode, dict):
        missing = {"dispatch_fn", "collect_fn"} - set(dispatch_mode)
        if missing or not all(callable(dispatch_mode[k]) for k in ("dispatch_fn", "collect_fn")):
            raise ValueError(
                f"a custom dispatch_mode must be {{'dispatch_fn': f, 'collect_fn': g}} with callables; "
                f"missing {sorted(missing)}"
            )
    elif not isinstance(dispatch_mode, Enum) or dispatch_mode.value not in DISPATCH_MODE_FNS:
        valid = ", ".join(f"Dispatch.{value.upper()}" for value in DISPATCH_MODE_FNS)
        raise ValueError(
            f"unknown dispatch_mode {dispatch_mode!r}; valid: {valid}, or a dict with dispatch_fn/collect_fn"
        )
    if not isinstance(execute_mode, Execute):
        raise ValueError(f"unknown execute_mode {execute_mode!r}; valid: Execute.ALL, Execute.RANK_ZERO")


# ---------------------------------------------------------------------------- register
def _materialize(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Resolve DataProtoFuture arguments inside the worker (the driver never fetched them)."""
    get = lambda v: v.get() if isinstance(v, DataProtoFuture) else v  # noqa: E731
    return tuple(get(a) for a in args), {k: get(v) for k, v in kwargs.items()}


def register(
    dispatch_mode: Enum | dict = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
):
    """Mark a worker method as a worker-group method with the given dispatch/execute modes.

    ``blocking=False`` makes the group method return futures (a ``DataProtoFuture`` for DataProto modes)
    that a following DataProto-dispatched call accepts as is; the worker resolves such futures before the
    method runs unless ``materialize_futures=False``.
    """
    _check_modes(dispatch_mode, execute_mode)

    def decorator(func):
        resolve = _materialize if materialize_futures else (lambda args, kwargs: (args, kwargs))
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def wrapper(*args, **kwargs):
                args, kwargs = resolve(args, kwargs)
                return await func(*args, **kwargs)
        else:

            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                args, kwargs = resolve(args, kwargs)
                return func(*args, **kwargs)

        setattr(
            wrapper, MAGIC_ATTR, {"dispatch_mode": dispatch_mode, "execute_mode": execute_mode, "blocking": blocking}
        )
        return wrapper

    return decorator


def registered_methods(cls: type) -> dict[str, dict[str, Any]]:
    """``{name: modes}`` for every method of ``cls`` that ``@register`` marked.

    ``dir()``, not ``cls.__dict__``: a class inherits registered methods (``Worker``'s own, a base role's).
    """
    methods = {}
    for name in dir(cls):
        attrs = getattr(getattr(cls, name, None), MAGIC_ATTR, None)
        if attrs is not None:
            methods[name] = attrs
    return methods
