"""The building blocks of config validation: ``ConfigError`` and the per-field range checks the schema runs.

Each check names the field, the value and what is valid (``train_batch_size=0: must be a positive integer``);
a parent component prefixes its own key (``ConfigError.under``), so the user sees the full dotted key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class ConfigError(ValueError):
    """A user's mistake, found before training starts: a config value, a file it names (model, data, tool config,
    reward function), LoRA targets, a run that would not fit in memory. The message alone, one line naming the key
    or file, the value and what would be valid, tells the user what to change: ``main.py`` prints it and exits with
    status 2, never a traceback. The one type for all of them (tools raise a subclass, ``ToolConfigError``)."""

    def __init__(self, message: str, *, key: str | None = None, value: Any = None, reason: str = "") -> None:
        super().__init__(message)
        self.key, self.value, self.reason = key, value, reason

    @classmethod
    def invalid(cls, key: str, value: Any, reason: str) -> ConfigError:
        """``key=value: reason``, keeping the parts so a parent can prefix the key (see ``under``)."""
        return cls(f"{key}={show(value)}: {reason}", key=key, value=value, reason=reason)

    def under(self, prefix: str) -> ConfigError:
        """The same error with ``prefix.`` in front of its key (a component only knows its own keys)."""
        return self if self.key is None else ConfigError.invalid(f"{prefix}.{self.key}", self.value, self.reason)


def show(value: Any) -> str:
    """A value as a command line writes it: ``null`` for None, a string quoted (so an empty one shows)."""
    if value is None:
        return "null"
    return repr(value) if isinstance(value, str) else str(value)


# ------------------------------------------------------------------------------------- per-field checks


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_files(v: Any) -> bool:
    return v is None or isinstance(v, str) or (isinstance(v, list) and all(isinstance(f, str) for f in v))


def check(obj: Any, names: Sequence[str], ok: Callable[[Any], bool], reason: str) -> None:
    for name in names:
        value = getattr(obj, name)
        # "${...}" defaults are checked once resolved, when the whole tree is built (config.load.to_config)
        if not (isinstance(value, str) and "${" in value) and not ok(value):
            raise ConfigError.invalid(name, value, reason)


def positive_int(obj: Any, *names: str) -> None:
    check(obj, names, lambda v: is_int(v) and v > 0, "must be a positive integer")


def optional_positive_int(obj: Any, *names: str) -> None:
    check(obj, names, lambda v: v is None or (is_int(v) and v > 0), "must be null or a positive integer")


def positive(obj: Any, *names: str) -> None:
    check(obj, names, lambda v: is_number(v) and v > 0, "must be > 0")


def non_negative(obj: Any, *names: str) -> None:
    check(obj, names, lambda v: is_number(v) and v >= 0, "must be >= 0")


def unit_interval(obj: Any, *names: str) -> None:
    check(obj, names, lambda v: is_number(v) and 0 <= v <= 1, "must be in [0, 1]")


def check_sampling(obj: Any) -> None:
    non_negative(obj, "temperature")
    check(obj, ["top_p"], lambda v: is_number(v) and 0 < v <= 1, "must be in (0, 1]")
    check(obj, ["top_k"], lambda v: is_int(v) and (v == -1 or v > 0), "must be -1 (off) or a positive integer")
