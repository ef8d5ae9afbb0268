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

from single_controller.ray.colocate import WorkerDict, colocated_class
from single_controller.ray.placement import RayClassWithInitArgs

__all__ = ["FusedWorker", "create_colocated_worker_cls_fused", "create_colocated_worker_raw_cls"]


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
    return colocated_class(FusedWorker, class_dict, "_".join(["FusedWorker", *class_dict]))


def create_colocated_worker_cls_fused(class_dict: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """The raw fused class, ready for a worker group (verl's ``fused_worker_used`` flag set; ColoRL needs none)."""
    cia = RayClassWithInitArgs(ray.remote(create_colocated_worker_raw_cls(class_dict)))
    cia.fused_worker_used = True
    return cia
