"""Colocation: several worker roles in one process, each role a view of one worker group.

``colocated_class(WorkerDict, {"actor": ClassWithInitArgs(Actor), "critic": ...}, name)`` gives a ``WorkerDict``
class: one process per rank builds every role's worker (``worker_dict[role]``). A group of it is split into
per-role views with ``spawn`` (base/worker_group.py); a view's methods are its role's registered methods, which
run through ``WorkerDict.execute_role(role, method, ...)`` in the worker's process. Ray's group starts the class
as an actor (``create_colocated_worker_cls``, ray/colocate.py), the local group as an object (local.py).
"""

from __future__ import annotations

import inspect
from typing import Any

from single_controller.base.register import registered_methods
from single_controller.base.worker import Worker

__all__ = ["AsyncRoles", "WorkerDict", "colocated_class"]


class WorkerDict(Worker):
    """Every role's worker in one process: ``worker_dict[role]``, built in the order the roles were given.

    The roles come from class attributes, set by :func:`colocated_class` on a subclass per colocation:
    ``raw_cls_dict`` maps each role to its worker class, ``role_inits`` to its arguments.
    """

    raw_cls_dict: dict[str, type] = {}
    role_inits: dict[str, tuple[tuple, dict]] = {}
    # a WorkerDict group also offers role R's method M as "R_M" on the group it starts, before spawn
    role_methods_on_group = True

    def __init__(self) -> None:
        super().__init__()
        # each role's Worker.__init__ reads the same RANK/WORLD_SIZE env: every role sees this process's rank
        self.worker_dict = {
            role: cls(*self.role_inits[role][0], **self.role_inits[role][1]) for role, cls in self.raw_cls_dict.items()
        }

    def execute_role(self, role: str, method_name: str, *args, **kwargs) -> Any:
        """Run ``worker_dict[role].<method_name>(*args, **kwargs)``: how a role view's calls reach their worker."""
        return getattr(self.worker_dict[role], method_name)(*args, **kwargs)


class AsyncRoles:
    """For roles with ``async def`` methods: ``execute_role`` awaits them (Ray runs the class as an async actor)."""

    async def execute_role(self, role: str, method_name: str, *args, **kwargs) -> Any:
        result = getattr(self.worker_dict[role], method_name)(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result


def colocated_class(base: type[WorkerDict], class_dict: dict[str, Any], name: str) -> type:
    """A subclass of ``base`` named ``name`` that holds the roles of ``class_dict`` (see :class:`WorkerDict`)."""
    for role, cia in class_dict.items():
        if not issubclass(cia.user_cls, Worker):
            raise TypeError(f"role {role!r}: {cia.user_cls.__name__} must subclass single_controller.base.Worker")
    has_async = any(
        inspect.iscoroutinefunction(getattr(cia.user_cls, method))
        for cia in class_dict.values()
        for method in registered_methods(cia.user_cls)
    )

    class Colocated(*((AsyncRoles, base) if has_async else (base,))):
        raw_cls_dict = {role: cia.user_cls for role, cia in class_dict.items()}
        role_inits = {role: (cia.args, cia.kwargs) for role, cia in class_dict.items()}

    Colocated.__name__ = Colocated.__qualname__ = name
    return Colocated
