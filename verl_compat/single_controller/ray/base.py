"""verl's ``verl.single_controller.ray.base``: worker groups, pools, worker classes and colocation, verl's API.

Each class is the core's with what only verl code uses (the trainer uses the core's):

- ``RayWorkerGroup`` (the core's in single_controller/ray/group.py): ``from_detached``, a group of running
  workers found by name or handle; ``fuse``, a fused group's role views as attributes; ``query_mesh`` (with the
  ``_query_dispatch_info`` / ``_query_collect_info`` group methods of verl's Worker), the layout of an n-d
  dispatch mesh, asked once (base/decorator.py); ``master_address`` / ``master_port``, the group's rendezvous.
- ``RayClassWithInitArgs`` (the core's in single_controller/ray/placement.py): ``update_options`` and
  ``set_additional_resource``, Ray options for every worker a group starts from it.
- Pools made from other pools (the trainer uses one): ``split_resource_pool(pool, split_size)`` cuts a pool's
  bundles, in rank order, into consecutive ``SubRayResourcePool``s; each holds its own worker group, all in the
  placement groups of the pool they were cut from (which keeps owning them), and can be split again.
  ``merge_resource_pool(rp1, rp2)`` spans both pools' bundles (rp1's ranks first), sharing their placement groups.
- Colocation (the core's in single_controller/ray/colocate.py): ``create_colocated_worker_cls`` gives a finished
  ``WorkerDict`` that is verl's Worker too; ``create_colocated_worker_raw_cls`` gives a class meant to be
  subclassed, whose methods see each role's worker as ``self.<role>`` (and in ``self.fused_worker_dict``), so a
  registered method of the subclass can chain roles in one call::

      class HybridWorker(create_colocated_worker_raw_cls({"actor": ..., "critic": ...})):
          @register(dispatch_mode=Dispatch.ONE_TO_ALL)
          def foo(self, x):
              return self.critic.sub(self.actor.add(x))

  A group of it has the subclass's registered methods; ``group.fuse(roles)`` adds one view per role as
  ``group.<role>`` (``spawn`` returns the same views), whose calls run on that role's worker.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import ray

from single_controller.errors import ContractError
from single_controller.ray import colocate
from single_controller.ray.group import RayWorkerGroup as CoreRayWorkerGroup
from single_controller.ray.placement import Bundle, RayResourcePool, ResourceUnavailableError
from single_controller.ray.placement import RayClassWithInitArgs as CoreRayClassWithInitArgs
from verl_compat.single_controller.base.worker import Worker

__all__ = [
    "FusedWorker",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourceUnavailableError",
    "SubRayResourcePool",
    "WorkerDict",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "merge_resource_pool",
    "split_resource_pool",
]


# ---------------------------------------------------------------------------- worker groups
class RayWorkerGroup(CoreRayWorkerGroup):
    """verl's RayWorkerGroup: the core's, with verl's methods beyond what the trainer uses."""

    @classmethod
    def from_detached(
        cls,
        name_prefix: str | None = None,
        worker_names: list[str] | None = None,
        worker_handles: list | None = None,
        ray_cls_with_init: Any = None,
        **kwargs,
    ) -> Any:
        """A group of running (detached) workers, found by name or handle."""
        return cls(
            ray_cls_with_init=ray_cls_with_init,
            name_prefix=name_prefix,
            worker_names=worker_names,
            worker_handles=worker_handles,
            **kwargs,
        )

    def fuse(self, prefix_set) -> None:
        """Make each role's view an attribute of this group: ``group.actor.add(...)`` (verl's fused API)."""
        for role, view in self.spawn(prefix_set).items():
            if hasattr(type(self), role):
                raise ValueError(f"role {role!r} would shadow {type(self).__name__}.{role}; rename the role")
            setattr(self, role, view)  # verl's fused group: group.<role> is that role's view

    def query_mesh(self, mesh_name: str) -> tuple[list[int], list[bool]]:
        """Per rank, its dp rank in ``mesh_name`` and whether it reports results (asked once, then cached)."""
        cache = self.__dict__.setdefault("_mesh_info", {})
        key = (self._role, mesh_name)  # a role view asks its role's workers
        if key not in cache:
            cache[key] = (self._query_dispatch_info(mesh_name), self._query_collect_info(mesh_name))
        return cache[key]

    @property
    def master_address(self) -> str | None:
        return self._master_addr

    @property
    def master_port(self) -> str | None:
        return self._master_port


# ---------------------------------------------------------------------------- worker classes
class RayClassWithInitArgs(CoreRayClassWithInitArgs):
    """A worker class with its arguments, and extra Ray actor options for every worker a group starts from it
    (verl's API)."""

    def update_options(self, options: dict[str, Any]) -> None:
        """Ray ``.options(...)`` to add when the group starts each worker (they win over the group's own)."""
        self._options.update(options)

    def set_additional_resource(self, additional_resource: dict[str, float]) -> None:
        """Custom Ray resources each worker asks for, e.g. ``{"my_accelerator": 1}``."""
        self._options["resources"] = dict(additional_resource)


# ---------------------------------------------------------------------------- pools made from pools
class SubRayResourcePool(RayResourcePool):
    """Bundles ``start_bundle_index ... start_bundle_index + subgroup_world_size - 1`` (in rank order) of the
    placement groups of another pool, whose ``process_on_nodes`` (store) is given as in verl."""

    def __init__(self, placement_groups: list, start_bundle_index: int, subgroup_world_size: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pgs = list(placement_groups)
        self.start_bundle_index = int(start_bundle_index)
        self.subgroup_world_size = int(subgroup_world_size)

    @property
    def world_size(self) -> int:
        return self.subgroup_world_size

    def bundles(self) -> list[Bundle]:
        """This pool's bundles; local ranks count this pool's ranks on each node from 0."""
        every = [(pg, i) for pg, n in zip(self.pgs, self.process_on_nodes) for i in range(n)]
        mine = every[self.start_bundle_index : self.start_bundle_index + self.subgroup_world_size]
        per_node = Counter(id(pg) for pg, _ in mine)
        seen: Counter = Counter()
        out = []
        for pg, index in mine:
            out.append(Bundle(pg, index, seen[id(pg)], per_node[id(pg)]))
            seen[id(pg)] += 1
        return out

    def release(self) -> None:
        """Nothing to release: the placement groups belong to the pool this one was cut from."""

    def __repr__(self) -> str:
        return (
            f"SubRayResourcePool(bundles {self.start_bundle_index}..{self.start_bundle_index + self.world_size - 1} "
            f"of {self.process_on_nodes})"
        )


def split_resource_pool(resource_pool: RayResourcePool, split_size: int | list[int]) -> list[SubRayResourcePool]:
    """Consecutive sub-pools of ``resource_pool``: of ``split_size`` bundles each, or of the sizes listed."""
    world = resource_pool.world_size
    if isinstance(split_size, int):
        if split_size <= 0 or world % split_size:
            raise ContractError(f"split_size must be a divisor of world_size {world}, got {split_size}")
        sizes = [split_size] * (world // split_size)
    else:
        sizes = [int(s) for s in split_size]
    if sum(sizes) != world or min(sizes) <= 0:
        raise ContractError(f"split_size must be positive sizes that sum up to world_size {world}, got {sizes}")
    start = getattr(resource_pool, "start_bundle_index", 0)
    starts = start + np.cumsum([0, *sizes[:-1]])
    pgs = resource_pool.get_placement_groups()
    return [
        SubRayResourcePool(
            pgs,
            int(first),
            size,
            process_on_nodes=resource_pool.store,
            use_gpu=resource_pool.use_gpu,
            name_prefix=f"{resource_pool.name_prefix}_split_{i}",
            max_colocate_count=resource_pool.max_colocate_count,
            cpus_per_bundle=resource_pool.cpus_per_bundle,
        )
        for i, (first, size) in enumerate(zip(starts, sizes))
    ]


def merge_resource_pool(rp1: RayResourcePool, rp2: RayResourcePool) -> RayResourcePool:
    """A pool spanning both pools' bundles (ranks: rp1's first, then rp2's); shares their placement groups."""
    if rp1.use_gpu != rp2.use_gpu or rp1.max_colocate_count != rp2.max_colocate_count:
        raise ValueError("merge_resource_pool needs pools with the same use_gpu and max_colocate_count")
    merged = RayResourcePool(
        rp1.process_on_nodes + rp2.process_on_nodes,
        use_gpu=rp1.use_gpu,
        name_prefix=f"{rp1.name_prefix}_{rp2.name_prefix}",
        max_colocate_count=rp1.max_colocate_count,
        cpus_per_bundle=rp1.cpus_per_bundle,
    )
    merged.pgs = rp1.get_placement_groups() + rp2.get_placement_groups()
    return merged


# ---------------------------------------------------------------------------- colocation
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
