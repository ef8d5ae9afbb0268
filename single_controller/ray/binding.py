"""Which methods a worker group has, and what calling one does: the one place a group's method names come from.

A worker method marked ``@register`` is a method of every group of that worker, under the same name:
``critic_wg.compute_values(batch)`` runs ``compute_values`` in each critic process. ``method_table`` decides
the names, from the worker class (``registered_methods``: the one ``dir()`` scan, in base/register.py):

- a group of a worker class: each registered method of the class, run on the worker object;
- a role view of a colocated group (``spawn``/``fuse``): each registered method of that role's class, run on
  the role's worker (through ``WorkerDict.execute_role``, single_controller/ray/colocate.py);
- a ``WorkerDict`` group itself: its own registered methods, plus ``<role>_<method>`` for every role's
  method (verl's names for them before ``spawn``; compat, the trainer always spawns).

``RayWorkerGroup.__getattr__`` looks names up in the table; a :class:`GroupMethod` does one call.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from single_controller.base.dispatch import proto_pad_size
from single_controller.base.register import Execute, get_dispatch_fns, is_padded, registered_methods
from single_controller.data_proto import DataProto
from single_controller.future import DataProtoFuture
from single_controller.ray.health import get_alive

__all__ = ["GroupMethod", "Target", "method_table"]


class Target(NamedTuple):
    """What a group method runs in each worker process: ``method`` of the role's worker, or of the worker itself."""

    role: str | None
    method: str


def method_table(user_cls: type, role: str | None) -> dict[str, tuple[Target, dict[str, Any]]]:
    """``{public name: (target, @register modes)}`` of a group of ``user_cls``, or of its ``role`` view."""
    if role is not None:
        return {
            name: (Target(role, name), attrs) for name, attrs in registered_methods(user_cls.raw_cls_dict[role]).items()
        }
    table = {name: (Target(None, name), attrs) for name, attrs in registered_methods(user_cls).items()}
    if getattr(user_cls, "role_methods_on_group", False):
        for each_role, cls in user_cls.raw_cls_dict.items():
            for name, attrs in registered_methods(cls).items():
                table[f"{each_role}_{name}"] = (Target(each_role, name), attrs)  # verl's WorkerDict name
    return table


class GroupMethod:
    """A registered worker method called on a whole group: dispatch -> run on the ranks -> wait -> collect -> trim.

    Waiting fails fast on a dead worker (``get_alive``); ``blocking=False`` methods return the futures
    instead (a ``DataProtoFuture`` for DataProto modes). Rows that dispatch added as padding are cut from the result.
    """

    def __init__(self, group: Any, public_name: str, target: Target, attrs: dict[str, Any]) -> None:
        self.group, self.target, self.blocking = group, target, attrs["blocking"]
        self.__name__ = public_name
        self.fns = get_dispatch_fns(attrs["dispatch_mode"])
        self.rank_zero = attrs["execute_mode"] is Execute.RANK_ZERO
        # rows are padded to a multiple of pad_divisor(group): a custom mode may name one (the n-d mode does)
        self.pad_divisor = self.fns.get("pad_divisor") or (_world_size if is_padded(attrs["dispatch_mode"]) else None)
        # e.g. "critic.compute_values", in error reports and in the driver's list of calls in flight
        self.call_name = f"{target.role or group.ray_cls_with_init.user_cls.__name__}.{target.method}"

    def __call__(self, *args, **kwargs):
        started = self.start(*args, **kwargs)
        return started.result() if self.blocking else started.collected(started.outputs)

    def start(self, *args, **kwargs) -> StartedCall:
        """Dispatch the call and start it on the ranks, without waiting: ``result()`` waits for it later (the
        rollout group's generation while the trainer's group trains, ``trainer.asynchronous.ahead``)."""
        group = self.group
        pad = proto_pad_size(self.pad_divisor(group), args, kwargs) if self.pad_divisor else 0
        rows = next((len(a) for a in (*args, *kwargs.values()) if isinstance(a, DataProto)), 0)
        args, kwargs = self.fns["dispatch_fn"](group, *args, **kwargs)
        if self.rank_zero:
            outputs = group.submit(self.target, [0], args, kwargs)[0]
        else:
            outputs = group.submit(self.target, range(group.world_size), args, kwargs)
        return StartedCall(self, outputs, rows if pad else None)

    def __repr__(self) -> str:
        return f"<group method {self.call_name}>"


class StartedCall:
    """A group call under way: ``outputs`` are its ranks' futures; ``keep``: the rows to keep (dispatch padded)."""

    def __init__(self, method: GroupMethod, outputs: Any, keep: int | None) -> None:
        self.method, self.outputs, self.keep = method, outputs, keep

    def result(self) -> Any:
        """Wait (failing fast on a dead worker: ``get_alive``), then collect the ranks' answers."""
        method = self.method
        return self.collected(get_alive(self.outputs, method.call_name, method.group.processes))

    def collected(self, outputs: Any) -> Any:
        result = self.method.fns["collect_fn"](self.method.group, outputs)
        return result if self.keep is None else _trim(result, keep=self.keep)


def _world_size(group: Any) -> int:
    return group.world_size


def _trim(result, keep: int):
    """Drop the rows that dispatch padding added."""
    if isinstance(result, DataProto):
        return result[:keep]
    if isinstance(result, DataProtoFuture):
        return DataProtoFuture(result.futures, keep=keep)
    return result
