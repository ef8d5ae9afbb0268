"""Pools made from other pools (verl's API; the trainer uses one pool): ``split_resource_pool`` and
``merge_resource_pool``.

- ``split_resource_pool(pool, split_size)`` cuts a pool's bundles, in rank order, into consecutive
  ``SubRayResourcePool``s; each holds its own worker group, all in the placement groups of the pool they
  were cut from (which keeps owning them). A sub-pool can be split again.
- ``merge_resource_pool(rp1, rp2)`` spans both pools' bundles (rp1's ranks first), sharing their placement groups.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from single_controller.errors import ContractError
from single_controller.ray.placement import Bundle, RayResourcePool

__all__ = ["SubRayResourcePool", "merge_resource_pool", "split_resource_pool"]


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
