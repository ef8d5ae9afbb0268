"""``@register``: how a worker method's arguments are spread over ranks and its results gathered.

``register`` only *records* a dispatch mode on the method. The worker group reads that record
when it is built and turns each marked method into a group method that runs
dispatch -> execute on the ranks -> (ray.get) -> collect. See ``RayWorkerGroup._bind_worker_methods``.

A dispatch mode is a pair of functions:

- ``dispatch_fn(worker_group, *args, **kwargs) -> (args, kwargs)`` where every returned argument is
  a list with one entry per rank;
- ``collect_fn(worker_group, outputs: list) -> result``.
"""

from __future__ import annotations

import functools
import inspect
from enum import Enum
from typing import Any, Callable

from single_controller.future import concat_results
from single_controller.protocol import DataProto, DataProtoFuture, pad_dataproto_to_divisor
from single_controller.tensor_batch import is_tensordict

MAGIC_ATTR = "_colorl_register"


class Dispatch(Enum):
    """Built-in ways to spread a call's arguments over the ranks of a worker group."""

    # used by the trainer
    ONE_TO_ALL = "one_to_all"  # every rank gets the same arguments
    DP_COMPUTE_PROTO = "dp_compute_proto"  # DataProto arguments are chunked over ranks, results concatenated
    # the seeds' API (and verl's): kept and tested, not used by the trainer
    ALL_TO_ALL = "all_to_all"  # arguments pass through; per-rank lists are split by execute
    DP_COMPUTE = "dp_compute"  # every argument is a list with one item per rank
    DP_COMPUTE_PROTO_WITH_FUNC = "dp_compute_proto_with_func"  # first argument is a function sent to every rank
    DP_COMPUTE_METRIC = "dp_compute_metric"  # chunked like DP_COMPUTE_PROTO, results returned as a list
    MEGATRON_COMPUTE = "megatron_compute"  # lists of length dp_size; see single_controller.ray.megatron
    MEGATRON_COMPUTE_PROTO = "megatron_compute_proto"


class Execute(Enum):
    ALL = "all"  # run on every rank
    RANK_ZERO = "rank_zero"  # run on rank 0 only and return its single result


# ---------------------------------------------------------------------------- dispatch functions
def _per_rank(args: tuple, kwargs: dict, make: Callable[[Any], list]) -> tuple[tuple, dict]:
    return tuple(make(a) for a in args), {k: make(v) for k, v in kwargs.items()}


def _list_checker(mode: str, size_name: str, size: int) -> Callable[[Any], list]:
    """Accept an argument only as a list (or tuple) of ``size`` items, one per rank or dp group."""

    def check(value) -> list:
        if not isinstance(value, (list, tuple)) or len(value) != size:
            got = f"{type(value).__name__} of length {len(value)}" if isinstance(value, (list, tuple)) else type(value).__name__
            raise ValueError(f"Dispatch.{mode} needs every argument to be a list of length {size_name}={size}, got {got}")
        return list(value)

    return check


def dispatch_one_to_all(worker_group, *args, **kwargs):
    n = worker_group.world_size
    return _per_rank(args, kwargs, lambda a: [a] * n)


def dispatch_all_to_all(worker_group, *args, **kwargs):
    return args, kwargs


def collect_all_to_all(worker_group, outputs):
    return outputs


def dispatch_dp_compute(worker_group, *args, **kwargs):
    return _per_rank(args, kwargs, _list_checker("DP_COMPUTE", "world_size", worker_group.world_size))


def collect_dp_compute(worker_group, outputs):
    if len(outputs) != worker_group.world_size:
        raise ValueError(f"expected {worker_group.world_size} outputs, got {len(outputs)}")
    return list(outputs)


def _chunk_proto(value, n: int, pad: int) -> list:
    if isinstance(value, DataProto):
        if pad:
            value, _ = pad_dataproto_to_divisor(value, n)
        return value.chunk(n)
    if isinstance(value, DataProtoFuture):
        return value.chunk(n)
    if is_tensordict(value):
        if len(value) % n:
            raise ValueError(f"a TensorDict argument is not padded: its batch size {len(value)} must divide into {n} parts")
        # clone: a pickled view of a TensorDict would carry its whole storage to every rank
        return [part.clone() for part in value.chunk(n)]
    raise TypeError(f"DataProto dispatch needs DataProto, DataProtoFuture or TensorDict arguments, got {type(value).__name__}")


def dispatch_dp_compute_data_proto(worker_group, *args, **kwargs):
    n = worker_group.world_size
    pad = proto_pad_size(n, args, kwargs)
    return _per_rank(args, kwargs, lambda a: _chunk_proto(a, n, pad))


def dispatch_dp_compute_data_proto_with_func(worker_group, func, *args, **kwargs):
    if not callable(func):
        raise TypeError(f"Dispatch.DP_COMPUTE_PROTO_WITH_FUNC needs a function as first argument, got {type(func).__name__}")
    n = worker_group.world_size
    args, kwargs = dispatch_dp_compute_data_proto(worker_group, *args, **kwargs)
    return ([func] * n, *args), kwargs


def collect_dp_compute_data_proto(worker_group, outputs):
    if outputs and all(_is_object_ref(o) for o in outputs):
        return DataProtoFuture(list(outputs))
    return concat_results(outputs)


def _is_object_ref(value) -> bool:
    import ray

    return isinstance(value, ray.ObjectRef)


def proto_pad_size(world_size: int, args: tuple, kwargs: dict) -> int:
    """Rows to append so that every DataProto argument divides ``world_size`` (0 when padding is off)."""
    protos = [a for a in (*args, *kwargs.values()) if isinstance(a, DataProto)]
    if not protos or not all(p.is_padding_enabled() for p in protos):
        return 0
    sizes = {len(p) for p in protos}
    if len(sizes) != 1:
        raise ValueError(f"DataProto arguments of one call must have equal sizes to be padded, got sizes {sorted(sizes)}")
    return (-sizes.pop()) % world_size


def _megatron_ranks(worker_group) -> tuple[list, int]:
    """Per-rank ``(tp_rank, dp_rank, pp_rank)`` (recorded by a tensor-parallel group at start-up) and dp_size."""
    info = getattr(worker_group, "_megatron_rank_info", None)
    if info is None:
        raise TypeError(
            f"Dispatch.MEGATRON_COMPUTE(_PROTO) needs a worker group that knows its ranks' tp/dp/pp ranks "
            f"(single_controller.ray.megatron.TensorParallelRayWorkerGroup); {type(worker_group).__name__} does not"
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

    return _per_rank(args, kwargs, spread)


def dispatch_megatron_compute(worker_group, *args, **kwargs):
    info, dp_size = _megatron_ranks(worker_group)
    return _spread_by_dp(info, args, kwargs, _list_checker("MEGATRON_COMPUTE", "dp_size", dp_size))


def collect_megatron_compute(worker_group, outputs):
    """Outputs of tp rank 0 of the last pipeline stage, one per dp rank, in dp order."""
    info, dp_size = _megatron_ranks(worker_group)
    last_stage = max(rank.pp_rank for rank in info)
    by_dp = {rank.dp_rank: out for rank, out in zip(info, outputs, strict=True) if rank.tp_rank == 0 and rank.pp_rank == last_stage}
    return [by_dp[dp] for dp in range(dp_size)]


def dispatch_megatron_compute_data_proto(worker_group, *args, **kwargs):
    info, dp_size = _megatron_ranks(worker_group)
    pad = proto_pad_size(dp_size, args, kwargs)
    return _spread_by_dp(info, args, kwargs, lambda value: _chunk_proto(value, dp_size, pad))


def collect_megatron_compute_data_proto(worker_group, outputs):
    return collect_dp_compute_data_proto(worker_group, collect_megatron_compute(worker_group, outputs))


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
            parts = [_put_once(part) for part in _chunk_proto(value, dp_size, pad)]
            return [parts[dp] for dp in dp_ranks]

        return _per_rank(args, kwargs, spread)

    def collect_fn(worker_group, outputs):
        dp_ranks, collect = worker_group.query_mesh(mesh_name)
        by_dp = {dp: out for dp, keep, out in zip(dp_ranks, collect, outputs, strict=True) if keep}
        return collect_dp_compute_data_proto(worker_group, [by_dp[dp] for dp in sorted(by_dp)])

    def pad_divisor(worker_group) -> int:
        return max(worker_group.query_mesh(mesh_name)[0]) + 1

    return {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn, "pad_divisor": pad_divisor}


DISPATCH_MODE_FNS: dict[Dispatch, dict[str, Callable]] = {
    Dispatch.ONE_TO_ALL: {"dispatch_fn": dispatch_one_to_all, "collect_fn": collect_all_to_all},
    Dispatch.ALL_TO_ALL: {"dispatch_fn": dispatch_all_to_all, "collect_fn": collect_all_to_all},
    Dispatch.DP_COMPUTE: {"dispatch_fn": dispatch_dp_compute, "collect_fn": collect_dp_compute},
    Dispatch.DP_COMPUTE_PROTO: {"dispatch_fn": dispatch_dp_compute_data_proto, "collect_fn": collect_dp_compute_data_proto},
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: {
        "dispatch_fn": dispatch_dp_compute_data_proto_with_func,
        "collect_fn": collect_dp_compute_data_proto,
    },
    Dispatch.DP_COMPUTE_METRIC: {"dispatch_fn": dispatch_dp_compute_data_proto, "collect_fn": collect_dp_compute},
    Dispatch.MEGATRON_COMPUTE: {"dispatch_fn": dispatch_megatron_compute, "collect_fn": collect_megatron_compute},
    Dispatch.MEGATRON_COMPUTE_PROTO: {
        "dispatch_fn": dispatch_megatron_compute_data_proto,
        "collect_fn": collect_megatron_compute_data_proto,
    },
}

# Modes that pad their DataProto arguments and whose result the group trims back. DP modes pad to a
# multiple of world_size, MEGATRON_COMPUTE_PROTO to one of dp_size: dp_size divides world_size, so
# whenever the latter pads the group's world-size check sees padding too and trims.
PADDED_MODES = (Dispatch.DP_COMPUTE_PROTO, Dispatch.DP_COMPUTE_PROTO_WITH_FUNC, Dispatch.MEGATRON_COMPUTE_PROTO)


def get_dispatch_fns(dispatch_mode: Dispatch | dict) -> dict[str, Callable]:
    """The ``{"dispatch_fn", "collect_fn"}`` pair of a mode (custom modes are such a dict already)."""
    if isinstance(dispatch_mode, dict):
        return dispatch_mode
    if dispatch_mode not in DISPATCH_MODE_FNS:
        raise NotImplementedError(f"{dispatch_mode} has no dispatch functions in this worker group")
    return DISPATCH_MODE_FNS[dispatch_mode]


def _check_modes(dispatch_mode, execute_mode) -> None:
    if isinstance(dispatch_mode, dict):
        missing = {"dispatch_fn", "collect_fn"} - set(dispatch_mode)
        if missing or not all(callable(dispatch_mode[k]) for k in ("dispatch_fn", "collect_fn")):
            raise ValueError(f"a custom dispatch_mode must be {{'dispatch_fn': f, 'collect_fn': g}} with callables; missing {sorted(missing)}")
    elif not isinstance(dispatch_mode, Dispatch):
        valid = ", ".join(f"Dispatch.{m.name}" for m in Dispatch)
        raise ValueError(f"unknown dispatch_mode {dispatch_mode!r}; valid: {valid}, or a dict with dispatch_fn/collect_fn")
    if not isinstance(execute_mode, Execute):
        raise ValueError(f"unknown execute_mode {execute_mode!r}; valid: Execute.ALL, Execute.RANK_ZERO")


# ---------------------------------------------------------------------------- register
def _materialize(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Resolve DataProtoFuture arguments inside the worker (the driver never fetched them)."""
    get = lambda v: v.get() if isinstance(v, DataProtoFuture) else v  # noqa: E731
    return tuple(get(a) for a in args), {k: get(v) for k, v in kwargs.items()}


def register(dispatch_mode: Dispatch | dict = Dispatch.ALL_TO_ALL, execute_mode: Execute = Execute.ALL, blocking: bool = True):
    """Mark a worker method as a worker-group method with the given dispatch/execute modes.

    ``blocking=False`` makes the group method return futures (a ``DataProtoFuture`` for
    DataProto modes) that a following DataProto-dispatched call accepts as is.
    """
    _check_modes(dispatch_mode, execute_mode)

    def decorator(func):
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def wrapper(*args, **kwargs):
                args, kwargs = _materialize(args, kwargs)
                return await func(*args, **kwargs)
        else:

            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                args, kwargs = _materialize(args, kwargs)
                return func(*args, **kwargs)

        setattr(wrapper, MAGIC_ATTR, {"dispatch_mode": dispatch_mode, "execute_mode": execute_mode, "blocking": blocking})
        return wrapper

    return decorator
