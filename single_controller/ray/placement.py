"""Where a worker group runs and what it starts: resource pools (placement groups) and worker classes.

- ``RayResourcePool`` reserves one bundle per worker process (a placement group per node); ``bundles()``
  lists them in rank order.
- ``RayClassWithInitArgs`` is a worker class plus the arguments to build it with.
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from single_controller.base.worker_group import ClassWithInitArgs

__all__ = ["Bundle", "ResourceUnavailableError", "RayResourcePool", "RayClassWithInitArgs"]


class ResourceUnavailableError(RuntimeError):
    """The Ray cluster cannot hold a resource pool."""


class Bundle(NamedTuple):
    """Where one rank runs: a bundle of a placement group, and the rank's place among its group's ranks on that node."""

    pg: Any
    index: int  # bundle index in the placement group
    local_rank: int
    local_world_size: int


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

    def bundles(self) -> list[Bundle]:
        """One bundle per rank, in rank order: node by node, bundle by bundle."""
        pgs = self.get_placement_groups()
        return [Bundle(pg, i, i, n) for pg, n in zip(pgs, self.process_on_nodes) for i in range(n)]

    def get_placement_groups(
        self, strategy: str = "STRICT_PACK", name: str | None = None, device_name: str | None = None
    ) -> list:
        """The placement groups (one per node entry), created and waited for on first call.

        ``strategy``: Ray's placement strategy of each group (``bin_pack=False`` in ported code is ``"PACK"``);
        ``name``: the groups' name prefix; ``device_name`` is accepted for ported callers (the bundles
        follow ``use_gpu``).
        """
        if self.pgs is None:
            if not ray.is_initialized():
                ray.init()
            self._check_cluster_can_hold()
            prefix = name or f"{self.name_prefix}_pg"
            pgs = [
                placement_group([self.bundle()] * n, strategy=strategy, name=f"{prefix}{i}")
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

    def release(self) -> None:
        """Remove this pool's placement groups (and so every actor in them)."""
        for pg in self.pgs or []:
            remove_placement_group(pg)
        self.pgs = None

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


class RayClassWithInitArgs(ClassWithInitArgs):
    """A worker class (``ray.remote`` or plain) and the arguments to construct it with."""

    def __init__(self, cls: Any, *args, **kwargs) -> None:
        super().__init__(cls if hasattr(cls, "__ray_actor_class__") else ray.remote(cls), *args, **kwargs)
        self._options: dict[str, Any] = {}  # update_options: extra Ray options for every worker

    @property
    def user_cls(self) -> type:
        """The plain Python class behind the Ray actor class."""
        return self.cls.__ray_actor_class__

    def __call__(
        self,
        bundle: Bundle,
        env_vars: dict[str, str],
        resources: dict[str, float],
        name: str | None = None,
        detached: bool = False,
    ):
        """Start one actor in ``bundle``; a named one, outliving its driver if ``detached``."""
        options = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=bundle.pg, placement_group_bundle_index=bundle.index
            ),
            "runtime_env": {"env_vars": env_vars},
            **resources,
            **({"name": name} if name else {}),
            **({"lifetime": "detached"} if detached else {}),
            **self._options,
        }
        return self.cls.options(**options).remote(*self.args, **self.kwargs)
