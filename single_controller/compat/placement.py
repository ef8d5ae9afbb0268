"""verl's ``RayClassWithInitArgs`` methods that the trainer does not use; single_controller/ray/__init__.py adds
them to the class."""

from __future__ import annotations

from typing import Any

__all__ = ["VerlClassOptions"]


class VerlClassOptions:
    """Extra Ray actor options for every worker a group starts from this class (verl's API)."""

    _options: dict[str, Any]

    def update_options(self, options: dict[str, Any]) -> None:
        """Ray ``.options(...)`` to add when the group starts each worker (they win over the group's own)."""
        self._options.update(options)

    def set_additional_resource(self, additional_resource: dict[str, float]) -> None:
        """Custom Ray resources each worker asks for, e.g. ``{"my_accelerator": 1}``."""
        self._options["resources"] = dict(additional_resource)
