"""verl's import path for ``@register`` and the dispatch modes (``verl.single_controller.base.decorator``).

It only re-exports: ``register``, ``Execute`` and the registry of modes are in base/register.py, the core's dispatch
functions in base/dispatch.py; verl's ``Dispatch`` (every mode) and the seeds' and verl's other modes in
compat/dispatch.py.
"""

from single_controller.base.dispatch import (
    collect_all_to_all,
    collect_dp_compute_data_proto,
    dispatch_all_to_all,
    dispatch_dp_compute_data_proto,
    dispatch_one_to_all,
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
from single_controller.compat.dispatch import (
    Dispatch,
    collect_dp_compute,
    collect_megatron_compute,
    collect_megatron_compute_data_proto,
    dispatch_dp_compute,
    dispatch_dp_compute_data_proto_with_func,
    dispatch_megatron_compute,
    dispatch_megatron_compute_data_proto,
    make_nd_compute_dataproto_dispatch_fn,
)
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
