"""Where a worker group runs and what it starts: resource pools (placement groups) and worker classes.

- ``RayResourcePool`` reserves one bundle per worker process (a placement group per node).
- ``RayClassWithInitArgs`` is a worker class plus the arguments to build it with.
"""

from __future__ import annotations

import uuid
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

__all__ = ["ResourceUnavailableError", "RayResourcePool", "RayClassWithInitArgs", "merge_resource_pool"]


class ResourceUnavailableError(RuntimeError):
    """The Ray cluster cannot hold a resource pool."""


class RayResourcePool:
    """``process_on_nodes[i]`` worker processes on node i, one bundle each.

    A bundle is ``{"CPU": cpus_per_bundle, "GPU": 1}`` with GPUs and ``{"CPU": cpus_per_bundle}``
    without. Up to ``max_colocate_count`` actors (of different worker groups) may share a bundle.
    Placement groups are created on first use; if the cluster cannot hold them, this raises
    within ``placement_timeout_s`` instead of waiting forever.
    """

    def __init__(
        self,
        process_on_nodes: list[int] | None = None,
        use_gpu: bool = True,
        name_prefix: str | None = None,
        max_colocate_count: int = 10,
        cpus_per_bundle: float = 1,
        placement_timeout_s: float = 30.0,
    ) -> None:
        self.process_on_nodes = list(process_on_nodes or [1])
        if not self.process_on_nodes or any(int(n) <= 0 for n in self.process_on_nodes):
            raise ValueError(f"process_on_nodes must be positive process counts per node, got {process_on_nodes}")
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix or uuid.uuid4().hex[:6]
        self.max_colocate_count = max_colocate_count
        self.cpus_per_bundle = cpus_per_bundle
        self.placement_timeout_s = placement_timeout_s
        self.pgs: list | None = None

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    @property
    def store(self) -> list[int]:
        return self.process_on_nodes

    def bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus_per_bundle, **({"GPU": 1} if self.use_gpu else {})}

    def get_placement_groups(self) -> list:
        """The placement groups (one per node entry), created and waited for on first call."""
        if self.pgs is None:
            if not ray.is_initialized():
                ray.init()
            self._check_cluster_can_hold()
            pgs = [
                placement_group([self.bundle()] * n, strategy="STRICT_PACK", name=f"{self.name_prefix}_pg{i}")
                for i, n in enumerate(self.process_on_nodes)
            ]
            ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=self.placement_timeout_s)
            if len(ready) < len(pgs):
                for pg in pgs:
                    remove_placement_group(pg)
                raise ResourceUnavailableError(
                    f"{self!r} could not be placed within {self.placement_timeout_s:.0f}s: it asks for "
                    f"{self._asked()} and the cluster has {_cpu_gpu(ray.available_resources())} free "
                    f"(other worker groups may hold the rest)"
                )
            self.pgs = pgs
        return self.pgs

    def _asked(self) -> str:
        return ", ".join(f"{n} x {self.bundle()} on one node" for n in self.process_on_nodes)

    def _check_cluster_can_hold(self) -> None:
        """Fail at once when no node could ever hold a placement group (e.g. GPUs on a CPU-only machine)."""
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        for n in self.process_on_nodes:
            need = {k: v * n for k, v in self.bundle().items()}
            if not any(all(node.get(k, 0) >= v for k, v in need.items()) for node in nodes):
                have = [_cpu_gpu(node) for node in nodes]
                hint = (
                    "no GPU is visible to Ray: use use_gpu=False (trainer.device=cpu) or a machine with GPUs"
                    if self.use_gpu and not any(node.get("GPU", 0) for node in nodes)
                    else "start Ray with more resources (ray.init(num_cpus=...)) or ask for fewer processes"
                )
                raise ResourceUnavailableError(
                    f"{self!r} needs {need} on a single node, but the Ray cluster's nodes have {have}; {hint}"
                )

    def __repr__(self) -> str:
        return f"RayResourcePool({self.process_on_nodes}, use_gpu={self.use_gpu})"


def _cpu_gpu(resources: dict) -> dict:
    return {k: resources.get(k, 0) for k in ("CPU", "GPU")}


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


class RayClassWithInitArgs:
    """A worker class (``ray.remote`` or plain) and the arguments to construct it with."""

    def __init__(self, cls: Any, *args, **kwargs) -> None:
        self.cls = cls if hasattr(cls, "__ray_actor_class__") else ray.remote(cls)
        self.args = args
        self.kwargs = kwargs
        self._options: dict[str, Any] = {}

    @property
    def user_cls(self) -> type:
        """The plain Python class behind the Ray actor class."""
        return self.cls.__ray_actor_class__

    def update_options(self, options: dict[str, Any]) -> None:
        self._options.update(options)

    def __call__(
        self, pg, bundle_index: int, env_vars: dict[str, str], resources: dict[str, float], name: str | None = None, detached: bool = False
    ):
        """Start one actor in bundle ``bundle_index`` of ``pg``; a named one, outliving its driver if ``detached``."""
        options = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle_index),
            "runtime_env": {"env_vars": env_vars},
            **resources,
            **({"name": name} if name else {}),
            **({"lifetime": "detached"} if detached else {}),
            **self._options,
        }
        return self.cls.options(**options).remote(*self.args, **self.kwargs)
