"""Colocation on Ray: a ``WorkerDict`` class (base/colocate.py) started as one Ray actor per rank.

``create_colocated_worker_cls({"actor": RayClassWithInitArgs(Actor), "critic": ...})`` gives the actor class of a
``WorkerDict``: one process per rank builds every role's worker. A group of it is split into per-role views with
``RayWorkerGroup.spawn``.
"""

from __future__ import annotations

from typing import Any

import ray

from single_controller.base.colocate import AsyncRoles, WorkerDict, colocated_class
from single_controller.ray.placement import RayClassWithInitArgs

__all__ = ["AsyncRoles", "WorkerDict", "colocated_class", "create_colocated_worker_cls"]


def create_colocated_worker_cls(class_dict: dict[str, Any]) -> RayClassWithInitArgs:
    """A ``WorkerDict`` class holding every role of ``class_dict`` in one process (see the module docstring)."""
    return RayClassWithInitArgs(ray.remote(colocated_class(WorkerDict, class_dict, "WorkerDict")))
