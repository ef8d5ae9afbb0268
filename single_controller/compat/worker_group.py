"""verl's ``RayWorkerGroup``: the core's (single_controller/ray/group.py) with the methods the trainer does not use.

- ``from_detached``: a group of running workers found by name or handle;
- ``fuse``: a fused group's role views as attributes (single_controller/compat/fused.py);
- ``query_mesh`` (with the ``_query_dispatch_info`` / ``_query_collect_info`` group methods every Worker
  has): the layout of an n-d dispatch mesh, asked once (single_controller/compat/dispatch.py);
- ``master_address`` / ``master_port``: the group's ``torch.distributed`` rendezvous.
"""

from __future__ import annotations

from typing import Any

from single_controller.ray.group import RayWorkerGroup as CoreRayWorkerGroup

__all__ = ["RayWorkerGroup"]


class RayWorkerGroup(CoreRayWorkerGroup):
    """verl's RayWorkerGroup: the core's, with verl's methods beyond what the trainer uses (verl's import paths,
    ``single_controller.ray`` and ``.ray.base``, give this class)."""

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
