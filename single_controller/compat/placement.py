"""verl's ``RayClassWithInitArgs``: the core's (single_controller/ray/placement.py) with the options the trainer
does not use."""

from __future__ import annotations

from typing import Any

from single_controller.ray.placement import RayClassWithInitArgs as CoreRayClassWithInitArgs

__all__ = ["RayClassWithInitArgs"]


class RayClassWithInitArgs(CoreRayClassWithInitArgs):
    """A worker class with its arguments, and extra Ray actor options for every worker a group starts from it
    (verl's API)."""

    def update_options(self, options: dict[str, Any]) -> None:
        """Ray ``.options(...)`` to add when the group starts each worker (they win over the group's own)."""
        self._options.update(options)

    def set_additional_resource(self, additional_resource: dict[str, float]) -> None:
        """Custom Ray resources each worker asks for, e.g. ``{"my_accelerator": 1}``."""
        self._options["resources"] = dict(additional_resource)
