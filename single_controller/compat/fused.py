"""verl's fused colocated class: ``create_colocated_worker_raw_cls`` (and ``create_colocated_worker_cls_fused``).

Where ``create_colocated_worker_cls`` gives a finished ``WorkerDict``, the raw class is meant to be subclassed:
its methods see each role's worker as ``self.<role>`` (and in ``self.fused_worker_dict``), so a registered
method of the subclass can chain roles in one call::

    class HybridWorker(create_colocated_worker_raw_cls({"actor": ..., "critic": ...})):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def foo(self, x):
            return self.critic.sub(self.actor.add(x))

A group of it has the subclass's registered methods; ``group.fuse(roles)`` adds one view per role as
``group.<role>`` (``spawn`` returns the same views), whose calls run on that role's worker.
"""

from __future__ import annotations

import ray

from single_controller.compat.placement import RayClassWithInitArgs
from single_controller.compat.worker import Worker
from single_controller.ray import colocate

__all__ = [
    "FusedWorker",
    "WorkerDict",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
]


class WorkerDict(colocate.WorkerDict, Worker):
    """verl's colocated class: the core's ``WorkerDict`` that is also verl's ``Worker`` (its methods on the group)."""


def create_colocated_worker_cls(class_dict: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """verl's ``create_colocated_worker_cls``: the core's, its ``WorkerDict`` verl's (see ``WorkerDict``)."""
    return RayClassWithInitArgs(ray.remote(colocate.colocated_class(WorkerDict, class_dict, "WorkerDict")))


class FusedWorker(WorkerDict):
    """A ``WorkerDict`` whose roles are also attributes: ``self.<role>``, and ``fused_worker_dict`` in every role."""

    role_methods_on_group = False  # verl's fused group offers the subclass's own methods, and roles through fuse()

    def __init__(self) -> None:
        super().__init__()
        self.fused_worker_dict = self.worker_dict
        for role, worker in self.worker_dict.items():
            setattr(self, role, worker)  # verl's fused API: self.<role> is that role's worker
            worker.fused_worker_dict = self.worker_dict  # each role can reach the others, as in verl


def create_colocated_worker_raw_cls(class_dict: dict[str, RayClassWithInitArgs]) -> type:
    """A ``FusedWorker`` subclass holding ``class_dict``'s roles, named ``FusedWorker_<role>_<role>...`` (verl's)."""
    return colocate.colocated_class(FusedWorker, class_dict, "_".join(["FusedWorker", *class_dict]))


def create_colocated_worker_cls_fused(class_dict: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """The raw fused class, ready for a worker group (verl's ``fused_worker_used`` flag set; ColoRL needs none)."""
    cia = RayClassWithInitArgs(ray.remote(create_colocated_worker_raw_cls(class_dict)))
    cia.fused_worker_used = True
    return cia
