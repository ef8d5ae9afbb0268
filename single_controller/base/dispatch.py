"""The dispatch modes the trainer uses: how a call's arguments are spread over the ranks, and how results return.

A dispatch mode is a pair of functions (a custom mode is such a dict, given to ``@register`` as is):

- ``dispatch_fn(worker_group, *args, **kwargs) -> (args, kwargs)``, every returned argument a list with one
  entry per rank (``RayWorkerGroup.execute_all`` gives rank i entry i);
- ``collect_fn(worker_group, outputs: list) -> result``.

``ONE_TO_ALL`` sends every rank the same arguments; ``DP_COMPUTE_PROTO`` chunks DataProto arguments over the
ranks (padded, see ``proto_pad_size``) and concatenates the results. ``ALL_TO_ALL`` (``@register``'s default)
passes the arguments through. Other modes register themselves under their own values (``add_dispatch_mode``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from single_controller.data_proto import DataProto
from single_controller.future import DataProtoFuture, concat_results
from single_controller.padding import pad_dataproto_to_divisor
from single_controller.tensor_batch import is_tensordict

__all__ = [
    "chunk_proto",
    "collect_all_to_all",
    "collect_dp_compute_data_proto",
    "dispatch_all_to_all",
    "dispatch_dp_compute_data_proto",
    "dispatch_one_to_all",
    "per_rank",
    "proto_pad_size",
]


def per_rank(args: tuple, kwargs: dict, make: Callable[[Any], list]) -> tuple[tuple, dict]:
    """Every argument turned into its per-rank list by ``make``."""
    return tuple(make(a) for a in args), {k: make(v) for k, v in kwargs.items()}


def dispatch_one_to_all(worker_group, *args, **kwargs):
    n = worker_group.world_size
    return per_rank(args, kwargs, lambda a: [a] * n)


def dispatch_all_to_all(worker_group, *args, **kwargs):
    return args, kwargs


def collect_all_to_all(worker_group, outputs):
    return outputs


def proto_pad_size(world_size: int, args: tuple, kwargs: dict) -> int:
    """Rows to append so that every DataProto argument divides ``world_size`` (0 when padding is off)."""
    protos = [a for a in (*args, *kwargs.values()) if isinstance(a, DataProto)]
    if not protos or not all(p.is_padding_enabled() for p in protos):
        return 0
    sizes = {len(p) for p in protos}
    if len(sizes) != 1:
        raise ValueError(
            f"DataProto arguments of one call must have equal sizes to be padded, got sizes {sorted(sizes)}"
        )
    return (-sizes.pop()) % world_size


def chunk_proto(value, n: int, pad: int) -> list:
    """``n`` parts of a DataProto (padded by ``pad`` rows first), a DataProtoFuture or a TensorDict argument."""
    if isinstance(value, DataProto):
        if pad:
            value, _ = pad_dataproto_to_divisor(value, n)
        return value.chunk(n)
    if isinstance(value, DataProtoFuture):
        return value.chunk(n)
    if is_tensordict(value):
        if len(value) % n:
            raise ValueError(
                f"a TensorDict argument is not padded: its batch size {len(value)} must divide into {n} parts"
            )
        # clone: a pickled view of a TensorDict would carry its whole storage to every rank
        return [part.clone() for part in value.chunk(n)]
    raise TypeError(
        f"DataProto dispatch needs DataProto, DataProtoFuture or TensorDict arguments, got {type(value).__name__}"
    )


def dispatch_dp_compute_data_proto(worker_group, *args, **kwargs):
    n = worker_group.world_size
    pad = proto_pad_size(n, args, kwargs)
    return per_rank(args, kwargs, lambda a: chunk_proto(a, n, pad))


def collect_dp_compute_data_proto(worker_group, outputs):
    if outputs and all(_is_object_ref(o) for o in outputs):
        return DataProtoFuture(list(outputs))
    return concat_results(outputs)


def _is_object_ref(value) -> bool:
    ray = sys.modules.get("ray")  # a run without Ray (single_controller/local.py) has no ObjectRefs
    return ray is not None and isinstance(value, ray.ObjectRef)
