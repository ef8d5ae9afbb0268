"""What every worker group is, Ray's or the local one: a worker class, its methods, and what calling one does.

A worker method marked ``@register`` is a method of every group of that worker, under the same name:
``critic_wg.compute_values(batch)`` runs ``compute_values`` on each rank. ``method_table`` decides the names,
from the worker class (``registered_methods``: the one ``dir()`` scan, in base/register.py):

- a group of a worker class: each registered method of the class, run on the worker object;
- a role view of a colocated group (``spawn``): each registered method of that role's class, run on the
  role's worker (through ``WorkerDict.execute_role``, base/colocate.py);
- a ``WorkerDict`` group itself: its own registered methods, plus ``<role>_<method>`` for every role's
  method (their names before ``spawn``, for ported code; the trainer always spawns).

:class:`WorkerGroup` holds what does not depend on where the workers live: binding, dispatch, collect, views.
A subclass says how a call reaches a worker (``_call``) and how its results are waited for (``wait``, ``get``):
``RayWorkerGroup`` (ray/group.py) with actors and ObjectRefs, ``LocalWorkerGroup`` (single_controller/local.py)
with objects of this process and their return values.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any, NamedTuple

from single_controller.base.dispatch import proto_pad_size
from single_controller.base.register import Execute, get_dispatch_fns, is_padded, registered_methods
from single_controller.data_proto import DataProto
from single_controller.future import DataProtoFuture

__all__ = ["ClassWithInitArgs", "GroupMethod", "StartedCall", "Target", "WorkerGroup", "method_table"]


class ClassWithInitArgs:
    """A plain worker class and the arguments to construct it with (``RayClassWithInitArgs`` wraps it for Ray)."""

    def __init__(self, cls: type, *args, **kwargs) -> None:
        self.cls, self.args, self.kwargs = cls, args, kwargs

    @property
    def user_cls(self) -> type:
        """The plain Python class of the workers."""
        return self.cls


class Target(NamedTuple):
    """What a group method runs on each rank: ``method`` of the role's worker, or of the worker itself."""

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
                table[f"{each_role}_{name}"] = (Target(each_role, name), attrs)  # the name on a WorkerDict group
    return table


class WorkerGroup:
    """Ranks ``0..world_size-1`` of one worker class, called as one. Subclasses start ``self._workers`` and
    define ``_call(worker, target, args, kwargs)`` (one rank's call: a future or its value), ``wait(outputs,
    call_name)`` (the ranks' values, failing fast on a dead rank) and ``get(outputs)`` (values, plainly)."""

    def __init__(self, cls_with_init: Any) -> None:
        self.ray_cls_with_init = cls_with_init  # the attribute ported code reads, for either kind of group
        self._role: str | None = None  # in a role view (spawn): the colocated role its calls run on
        self._methods = self._bind()  # before any worker starts: a name clash is refused at no cost

    @property
    def world_size(self) -> int:
        return len(self._workers)

    @property
    def workers(self) -> list:
        return self._workers

    # ---------------------------------------------------------------- methods
    def _bind(self) -> dict[str, GroupMethod]:
        """This group's methods, by name (``method_table``)."""
        table = method_table(self.ray_cls_with_init.user_cls, self._role)
        for name, (target, _) in table.items():
            if hasattr(type(self), name):
                raise ValueError(
                    f"worker method {target.method!r} would shadow {type(self).__name__}.{name}; rename it"
                )
        return {name: GroupMethod(self, name, target, attrs) for name, (target, attrs) in table.items()}

    def __getattr__(self, name: str) -> GroupMethod:
        """A registered worker method, as a group method (found only when no attribute of the group has the name)."""
        methods = self.__dict__.get("_methods")  # absent while copy/pickle rebuild the object
        if methods is not None and name in methods:
            return methods[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __dir__(self) -> Iterable[str]:
        return [*super().__dir__(), *self.__dict__.get("_methods", {})]

    # ---------------------------------------------------------------- execution
    def submit(self, target: Target, ranks: Iterable[int], args: tuple, kwargs: dict) -> list:
        """Start ``target`` on ``ranks``; returns one output per rank. Rank i gets item i of every argument when
        each argument is a list of world_size items, else all of them."""
        outputs = []
        for rank in ranks:
            a, kw = self._args_for_rank(rank, args, kwargs)
            outputs.append(self._call(self._workers[rank], target, a, kw))
        return outputs

    def _call(self, worker: Any, target: Target, args: tuple, kwargs: dict) -> Any:
        raise NotImplementedError

    def wait(self, outputs: list, call_name: str) -> list:
        raise NotImplementedError

    def get(self, outputs: Any) -> Any:
        raise NotImplementedError

    def _args_for_rank(self, rank: int, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        values = [*args, *kwargs.values()]
        if values and all(isinstance(v, list) and len(v) == self.world_size for v in values):
            return tuple(a[rank] for a in args), {k: v[rank] for k, v in kwargs.items()}
        return args, kwargs

    def execute_all_async(self, method_name: str, *args, **kwargs) -> list:
        """Call ``method_name`` (any worker method, registered or not; in a role view, the role's) on every rank."""
        return self.submit(Target(self._role, method_name), range(self.world_size), args, kwargs)

    def execute_all_sync(self, method_name: str, *args, **kwargs) -> list:
        return self.get(self.execute_all_async(method_name, *args, **kwargs))

    execute_all = execute_all_async

    def execute_rank_zero_async(self, method_name: str, *args, **kwargs):
        return self.submit(Target(self._role, method_name), [0], args, kwargs)[0]

    def execute_rank_zero_sync(self, method_name: str, *args, **kwargs):
        return self.get(self.execute_rank_zero_async(method_name, *args, **kwargs))

    execute_rank_zero = execute_rank_zero_async

    # ---------------------------------------------------------------- colocated roles
    def spawn(self, prefix_set) -> dict[str, WorkerGroup]:
        """Per-role views of a colocated group: ``spawn(["actor"])["actor"].add`` runs the actor role's ``add``."""
        roles = getattr(self.ray_cls_with_init.user_cls, "raw_cls_dict", {})
        views = {}
        for role in prefix_set:
            if role not in roles:
                raise ValueError(
                    f"{role!r} is not a role of {self.ray_cls_with_init.user_cls.__name__}; its roles: {sorted(roles)}"
                )
            view = copy.copy(self)  # the same workers and processes
            view._role = role
            view._methods = view._bind()
            views[role] = view
        return views


class GroupMethod:
    """A registered worker method called on a whole group: dispatch -> run on the ranks -> wait -> collect -> trim.

    Waiting fails fast on a dead worker (the group's ``wait``); ``blocking=False`` methods return the futures
    instead (a ``DataProtoFuture`` for DataProto modes). Rows that dispatch added as padding are cut from the result.
    """

    def __init__(self, group: WorkerGroup, public_name: str, target: Target, attrs: dict[str, Any]) -> None:
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
        """Wait (failing fast on a dead worker), then collect the ranks' answers."""
        method = self.method
        return self.collected(method.group.wait(self.outputs, method.call_name))

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
