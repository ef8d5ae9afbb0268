"""Padding a DataProto to a multiple of the ranks: the process-wide switch and the pad/unpad helpers.

Who decides whether a batch may be padded, first match wins:

1. the batch's own ``meta_info[DataProtoConfig.auto_padding_key]`` (``DataProto.from_dict(..., auto_padding=...)``);
2. ``DataProtoConfig.auto_padding = True/False`` set in code (``None`` hands back to the environment);
3. ``COLORL_AUTO_PADDING`` in the environment (``0``/``false``/``no`` is off);
4. nobody: worker-group dispatch pads a copy of the batch (ColoRL's default), while
   ``DataProto.chunk`` splits only evenly, since nobody asked for uneven parts.

Another library's spellings of 1 and 3 are honoured after ColoRL's own once its door package names them
(``add_spelling``, on import); the meta_info key that ``from_dict`` writes is then the library's.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "AUTO_PADDING_KEY",
    "DataProtoConfig",
    "add_spelling",
    "pad_dataproto_to_divisor",
    "padding_choice",
    "unpad_dataproto",
]

AUTO_PADDING_KEY = "_colorl_auto_padding"  # ColoRL's meta_info key
_META_KEYS = [AUTO_PADDING_KEY]  # a batch's own choice, first match wins
_ENV_NAMES = ["COLORL_AUTO_PADDING"]  # the environment's choice, first set wins


class _AutoPaddingSwitch(type):
    """``DataProtoConfig.auto_padding``: what code set, else the environment's choice, else on."""

    _set_in_code: bool | None = None

    @property
    def auto_padding(cls) -> bool:
        chosen = cls.chosen()
        return True if chosen is None else chosen

    @auto_padding.setter
    def auto_padding(cls, value: bool | None) -> None:
        cls._set_in_code = None if value is None else bool(value)

    def chosen(cls) -> bool | None:
        """The process-wide choice (code, then environment); ``None`` where nobody chose."""
        if cls._set_in_code is not None:
            return cls._set_in_code
        env = next((os.environ[name] for name in _ENV_NAMES if name in os.environ), None)
        return None if env is None else env.strip().lower() not in ("0", "false", "no")


class DataProtoConfig(metaclass=_AutoPaddingSwitch):
    """Process-wide switch: may a batch be padded to a multiple of the ranks (see the module docstring)?"""

    auto_padding_key = AUTO_PADDING_KEY  # the key from_dict(auto_padding=...) writes


def add_spelling(meta_key: str, env_name: str) -> None:
    """Honour ``meta_key`` in a batch's meta_info and ``env_name`` in the environment too, after ColoRL's own
    names; ``from_dict(auto_padding=...)`` writes ``meta_key`` from now on. Naming them twice changes nothing."""
    if meta_key not in _META_KEYS:
        _META_KEYS.append(meta_key)
    if env_name not in _ENV_NAMES:
        _ENV_NAMES.append(env_name)
    DataProtoConfig.auto_padding_key = meta_key


def padding_choice(meta_info: dict[str, Any]) -> bool | None:
    """Whether padding was turned on or off for a batch with this meta_info; ``None`` where nobody chose."""
    key = next((key for key in _META_KEYS if key in meta_info), None)
    return DataProtoConfig.chosen() if key is None else bool(meta_info[key])


def pad_dataproto_to_divisor(data: Any, size_divisor: int) -> tuple[Any, int]:
    """Return ``(padded, pad_size)``: rows repeated from the start until ``len % size_divisor == 0``.

    The input is not modified.
    """
    pad_size = (-len(data)) % size_divisor
    if pad_size == 0:
        return data, 0
    if len(data) == 0:
        raise ValueError("cannot pad an empty DataProto")
    import torch  # here: a door names its spellings (add_spelling) on import, before anything needs torch

    rows = torch.arange(len(data) + pad_size) % len(data)
    return data._select_rows(rows), pad_size


def unpad_dataproto(data: Any, pad_size: int) -> Any:
    """``data`` without its last ``pad_size`` rows (what :func:`pad_dataproto_to_divisor` added)."""
    return data[: len(data) - pad_size] if pad_size else data
