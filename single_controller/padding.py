"""Padding a DataProto to a multiple of the ranks: the process-wide switch and the pad/unpad helpers.

Who decides whether a batch may be padded, first match wins:

1. the batch's own ``meta_info["_verl_auto_padding"]`` (``DataProto.from_dict(..., auto_padding=...)``);
2. ``DataProtoConfig.auto_padding = True/False`` set in code (``None`` hands back to the environment);
3. ``COLORL_AUTO_PADDING`` or ``VERL_AUTO_PADDING`` in the environment (``0``/``false``/``no`` is off);
4. nobody: worker-group dispatch pads a copy of the batch (ColoRL's default), while
   ``DataProto.chunk`` splits only evenly, since nobody asked for uneven parts.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["AUTO_PADDING_KEY", "DataProtoConfig", "pad_dataproto_to_divisor", "padding_choice", "unpad_dataproto"]

AUTO_PADDING_KEY = "_verl_auto_padding"  # the meta_info key, as ported code sets it


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
        env = os.environ.get("COLORL_AUTO_PADDING", os.environ.get("VERL_AUTO_PADDING"))
        return None if env is None else env.strip().lower() not in ("0", "false", "no")


class DataProtoConfig(metaclass=_AutoPaddingSwitch):
    """Process-wide switch: may a batch be padded to a multiple of the ranks (see the module docstring)?"""

    auto_padding_key = AUTO_PADDING_KEY


def padding_choice(meta_info: dict[str, Any]) -> bool | None:
    """Whether padding was turned on or off for a batch with this meta_info; ``None`` where nobody chose."""
    if AUTO_PADDING_KEY in meta_info:
        return bool(meta_info[AUTO_PADDING_KEY])
    return DataProtoConfig.chosen()


def pad_dataproto_to_divisor(data: Any, size_divisor: int) -> tuple[Any, int]:
    """Return ``(padded, pad_size)``: rows repeated from the start until ``len % size_divisor == 0``.

    The input is not modified.
    """
    pad_size = (-len(data)) % size_divisor
    if pad_size == 0:
        return data, 0
    if len(data) == 0:
        raise ValueError("cannot pad an empty DataProto")
    rows = torch.arange(len(data) + pad_size) % len(data)
    return data._select_rows(rows), pad_size


def unpad_dataproto(data: Any, pad_size: int) -> Any:
    """``data`` without its last ``pad_size`` rows (what :func:`pad_dataproto_to_divisor` added)."""
    return data[: len(data) - pad_size] if pad_size else data
