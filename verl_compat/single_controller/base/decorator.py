"""verl's ``verl.single_controller.base.decorator``: ``@register`` and every dispatch mode, verl's API.

``register``, ``Execute`` and the registry of modes are the core's (single_controller/base/register.py), with the
core's dispatch functions (base/dispatch.py). Here: verl's ``Dispatch``, an enum of every mode (the core's three
too, by the same values: a member of either enum names the same mode), and the modes the trainer does not use,
the seeds' and verl's (``Dispatch.DP_COMPUTE``, ``DP_COMPUTE_METRIC``, ``DP_COMPUTE_PROTO_WITH_FUNC``,
``MEGATRON_COMPUTE(_PROTO)``) and verl's n-d mesh dispatch. Each is a ``dispatch_fn``/``collect_fn`` pair as
described in single_controller/base/dispatch.py, registered under its value at the end of this module
(``add_dispatch_mode``).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from single_controller.base.dispatch import (
    chunk_proto,
    collect_all_to_all,
    collect_dp_compute_data_proto,
    dispatch_all_to_all,
    dispatch_dp_compute_data_proto,
    dispatch_one_to_all,
    per_rank,
    proto_pad_size,
)
from single_controller.base.register import (
    DISPATCH_MODE_FNS,
    MAGIC_ATTR,
    PADDED_MODES,
    Execute,
    add_dispatch_mode,
    get_dispatch_fns,
    is_padded,
    register,
    registered_methods,
)
from single_controller.base.register import Dispatch as CoreDispatch
from single_controller.future import DataProtoFuture

__all__ = [
    "DISPATCH_MODE_FNS",
    "MAGIC_ATTR",
    "PADDED_MODES",
    "DataProtoFuture",
    "Dispatch",
    "Execute",
    "add_dispatch_mode",
    "collect_all_to_all",
    "collect_dp_compute",
    "collect_dp_compute_data_proto",
    "collect_megatron_compute",
    "collect_megatron_compute_data_proto",
    "dispatch_all_to_all",
    "dispatch_dp_compute",
    "dispatch_dp_compute_data_proto",
    "dispatch_dp_compute_data_proto_with_func",
    "dispatch_megatron_compute",
    "dispatch_megatron_compute_data_proto",
    "dispatch_one_to_all",
    "get_dispatch_fns",
    "is_padded",
    "make_nd_compute_dataproto_dispatch_fn",
    "proto_pad_size",
    "register",
    "registered_methods",
]


def _list_checker(mode: str, size_name: str, size: int) -> Callable[[Any], list]:
    """Accept an argument only as a list (or tuple) of ``size`` items, one per rank or dp group."""

    def check(value) -> list:
        if not isinstance(value, (list, tuple)) or len(value) != size:
            got = (
                f"{type(value).__name__} of length {len(value)}"
                if isinstance(value, (list, tuple))
                else type(value).__name__
            )
            raise ValueError(
                f"Dispatch.{mode} needs every argument to be a list of length {size_name}={size}, got {got}"
            )
        return list(value)

    return check


# ---------------------------------------------------------------------------- DP_COMPUTE, _METRIC, _PROTO_WITH_FUNC
def dispatch_dp_compute(worker_group, *args, **kwargs):
    return per_rank(args, kwargs, _list_checker("DP_COMPUTE", "world_size", worker_group.world_size))


def collect_dp_compute(worker_group, outputs):
    if len(outputs) != worker_group.world_size:
        raise ValueError(f"expected {worker_group.world_size} outputs, got {len(outputs)}")
    return list(outputs)


def dispatch_dp_compute_data_proto_with_func(worker_group, func, *args, **kwargs):
    if not callable(func):
        raise TypeError(
            f"Dispatch.DP_COMPUTE_PROTO_WITH_FUNC needs a function as first argument, got {type(func).__name__}"
        )
    n = worker_group.world_size
    args, kwargs = dispatch_dp_compute_data_proto(worker_group, *args, **kwargs)
    return ([func] * n, *args), kwargs


# ---------------------------------------------------------------------------- MEGATRON_COMPUTE(_PROTO)
def _megatron_ranks(worker_group) -> tuple[list, int]:
    """Per-rank ``(tp_rank, dp_rank, pp_rank)`` (recorded by a tensor-parallel group at start-up) and dp_size."""
    info = getattr(worker_group, "_megatron_rank_info", None)
    if info is None:
        raise TypeError(
            f"Dispatch.MEGATRON_COMPUTE(_PROTO) needs a worker group that knows its ranks' tp/dp/pp ranks "
            f"(ray/megatron.py's TensorParallelRayWorkerGroup); {type(worker_group).__name__} does not"
        )
    return info, 1 + max(rank.dp_rank for rank in info)


def _put_once(value):
    """Store ``value`` in Ray's object store once for all the ranks that receive it (Ray resolves the ref)."""
    import ray

    if isinstance(value, (ray.ObjectRef, DataProtoFuture)) or not ray.is_initialized():
        return value
    return ray.put(value)


def _spread_by_dp(info: list, args: tuple, kwargs: dict, split: Callable[[Any], list]) -> tuple[tuple, dict]:
    """``split(arg)`` gives one item per dp rank; every rank (any tp/pp rank) gets the item of its dp rank."""

    def spread(value) -> list:
        items = [_put_once(item) for item in split(value)]
        return [items[rank.dp_rank] for rank in info]

    return per_rank(args, kwargs, spread)


def dispatch_megatron_compute(worker_group, *args, **kwargs):
    info, dp_size = _megatron_ranks(worker_group)
    return _spread_by_dp(info, args, kwargs, _list_checker("MEGATRON_COMPUTE", "dp_size", dp_size))


def collect_megatron_compute(worker_group, outputs):
    """Outputs of tp rank 0 of the last pipeline stage, one per dp rank, in dp order."""
    info, dp_size = _megatron_ranks(worker_group)
    last_stage = max(rank.pp_rank for rank in info)
    by_dp = {
        rank.dp_rank: out
        for rank, out in zip(info, outputs, strict=True)
        if rank.tp_rank == 0 and rank.pp_rank == last_stage
    }
    return [by_dp[dp] for dp in range(dp_size)]


def dispatch_megatron_compute_data_proto(worker_group, *args, **kwargs):
    info, dp_size = _megatron_ranks(worker_group)
    pad = proto_pad_size(dp_size, args, kwargs)
    return _spread_by_dp(info, args, kwargs, lambda value: chunk_proto(value, dp_size, pad))


def collect_megatron_compute_data_proto(worker_group, outputs):
    return collect_dp_compute_data_proto(worker_group, collect_megatron_compute(worker_group, outputs))


# ---------------------------------------------------------------------------- n-d meshes (verl's device-mesh API)
def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> dict[str, Callable]:
    """A dispatch mode for ranks laid out in an n-d mesh (e.g. dp x tp): data is split over the dp ranks only.

    Every rank declares ``self._register_dispatch_collect_info(mesh_name, dp_rank, is_collect)``. A call
    chunks each DataProto (padded) or TensorDict argument into ``dp_size`` parts, gives every rank the part
    of its dp rank, and concatenates, in dp order, the results of the ranks marked ``is_collect``.
    """

    def dispatch_fn(worker_group, *args, **kwargs):
        dp_ranks, _ = worker_group.query_mesh(mesh_name)
        dp_size = max(dp_ranks) + 1
        pad = proto_pad_size(dp_size, args, kwargs)

        def spread(value) -> list:
            parts = [_put_once(part) for part in chunk_proto(value, dp_size, pad)]
            return [parts[dp] for dp in dp_ranks]

        return per_rank(args, kwargs, spread)

    def collect_fn(worker_group, outputs):
        dp_ranks, collect = worker_group.query_mesh(mesh_name)
        by_dp = {dp: out for dp, keep, out in zip(dp_ranks, collect, outputs, strict=True) if keep}
        return collect_dp_compute_data_proto(worker_group, [by_dp[dp] for dp in sorted(by_dp)])

    def pad_divisor(worker_group) -> int:
        return max(worker_group.query_mesh(mesh_name)[0]) + 1

    return {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn, "pad_divisor": pad_divisor}


# ---------------------------------------------------------------------------- the modes, registered
class Dispatch(Enum):
    """verl's names of the ways to spread a call's arguments over the ranks of a worker group: the core's modes
    (``single_controller.base.register.Dispatch``, the same values) and the seeds' and verl's."""

    ONE_TO_ALL = CoreDispatch.ONE_TO_ALL.value
    DP_COMPUTE_PROTO = CoreDispatch.DP_COMPUTE_PROTO.value
    ALL_TO_ALL = CoreDispatch.ALL_TO_ALL.value
    DP_COMPUTE = "dp_compute"  # every argument is a list with one item per rank
    DP_COMPUTE_PROTO_WITH_FUNC = "dp_compute_proto_with_func"  # first argument is a function sent to every rank
    DP_COMPUTE_METRIC = "dp_compute_metric"  # chunked like DP_COMPUTE_PROTO, results returned as a list
    MEGATRON_COMPUTE = "megatron_compute"  # lists of length dp_size; see ray/megatron.py
    MEGATRON_COMPUTE_PROTO = "megatron_compute_proto"


add_dispatch_mode(Dispatch.DP_COMPUTE, dispatch_dp_compute, collect_dp_compute)
add_dispatch_mode(
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC,
    dispatch_dp_compute_data_proto_with_func,
    collect_dp_compute_data_proto,
    padded=True,
)
add_dispatch_mode(Dispatch.DP_COMPUTE_METRIC, dispatch_dp_compute_data_proto, collect_dp_compute)
add_dispatch_mode(Dispatch.MEGATRON_COMPUTE, dispatch_megatron_compute, collect_megatron_compute)
add_dispatch_mode(
    Dispatch.MEGATRON_COMPUTE_PROTO,
    dispatch_megatron_compute_data_proto,
    collect_megatron_compute_data_proto,
    padded=True,
)
