"""The hook through which a command-line dialect reaches the loader, so that ``config`` never imports it.

An ``Adapter`` is what the loader asks, once per load, about keys that are not ColoRL's own: the schema the keys are
checked against and take their defaults from (``schema``: ColoRL's ``PPOConfig``, or a subclass declaring the
dialect's own keys too), where an override's key lives now (``overrides``), the composed tree with older spellings
moved (``tree``), whether a value must be refused (``check``), and, later, the one-line warnings for keys set that
nothing honours (``warnings``, printed when the trainer is built and by a dry run) and a recorded key's current place
(``current_place``, for resuming).
The base class answers for ColoRL's own keys: nothing moves, nothing warns. The door's command-line package
installs its adapter when imported (``install``; docs/verl_api.md); the entry point and the tests import it, so the
core's loader speaks that dialect without importing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from config.schema import PPOConfig


class Adapter:
    """ColoRL's own keys only: every answer is the identity (subclass to translate another trainer's keys)."""

    def schema(self) -> type:
        """The root config class composed and built (``config.schema.PPOConfig``, or a subclass of it)."""
        return PPOConfig

    def overrides(self, overrides: Sequence[str]) -> list[str]:
        """Command-line overrides with their keys in the places the schema has them."""
        return list(overrides)

    def tree(self, written: dict) -> dict:
        """A composed config (plain containers, interpolations as written) in the schema's places."""
        return written

    def check(self, cfg: Any) -> None:
        """Raise ``ConfigError`` for a value that would change the results and cannot be honoured."""

    def warnings(self, cfg: Any) -> list[str]:
        """One line per key set to a value nothing honours (what is done instead)."""
        return []

    def current_place(self, key: str) -> str:
        """Where dotted ``key``, as a checkpoint recorded it, lives now."""
        return key


_installed: list[Adapter] = [Adapter()]


def install(adapter: Adapter) -> None:
    """Make ``adapter`` the one the loader, the trainer's warnings and resuming use when none is passed."""
    _installed[0] = adapter


def installed() -> Adapter:
    """The adapter ``install`` set (``Adapter()`` until one is)."""
    return _installed[0]
