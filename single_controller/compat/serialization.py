"""verl's numpy encoding of tensors and TensorDicts (``verl.protocol.serialize_*``), for code that calls it.

A tensor is encoded as ``(dtype name, shape, its bytes as a uint8 numpy array)``, so any dtype travels,
bfloat16 and float8 included; a nested tensor as ``(layout name, [encoding of each component])``; a
TensorDict as ``(batch_size, device or None, {key: encoding})``. ColoRL's own DataProto pickling does not
go through these (single_controller/tensor_batch.py ``pack``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["deserialize_single_tensor", "deserialize_tensordict", "serialize_single_tensor", "serialize_tensordict"]


def serialize_single_tensor(obj: torch.Tensor) -> tuple[str, tuple[int, ...], np.ndarray]:
    """``(dtype name, shape, raw bytes as uint8)`` of a (non-nested) tensor; the bytes are a copy on the CPU."""
    flat = obj.detach().cpu().contiguous().flatten()
    return str(obj.dtype).removeprefix("torch."), tuple(obj.shape), flat.view(torch.uint8).numpy()


def deserialize_single_tensor(arr: tuple[str, tuple[int, ...], Any]) -> torch.Tensor:
    """The tensor :func:`serialize_single_tensor` encoded (in its own, writable memory)."""
    dtype_name, shape, data = arr
    dtype = getattr(torch, dtype_name)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{dtype_name!r} is not a torch dtype")
    buffer = bytearray(memoryview(data))
    if not buffer:  # torch.frombuffer refuses an empty buffer
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).view(shape)


def serialize_tensordict(batch: Any) -> tuple[tuple[int, ...], str | None, dict[str, tuple]]:
    """``(batch_size, device, {key: encoding})`` of a TensorDict; nested tensors are encoded component by component."""
    items = {}
    for key, value in batch.items():
        if value.is_nested:
            items[key] = (
                str(value.layout).removeprefix("torch."),
                [serialize_single_tensor(t) for t in value.unbind()],
            )
        else:
            items[key] = serialize_single_tensor(value)
    device = str(batch.device) if batch.device is not None else None
    return tuple(batch.batch_size), device, items


def deserialize_tensordict(arr: tuple) -> Any:
    """The TensorDict :func:`serialize_tensordict` encoded."""
    from tensordict import TensorDict

    batch_size, device, items = arr
    tensors = {}
    for key, encoded in items.items():
        if len(encoded) == 3:
            tensors[key] = deserialize_single_tensor(encoded)
        elif len(encoded) == 2:
            layout, parts = encoded
            tensors[key] = torch.nested.as_nested_tensor(
                [deserialize_single_tensor(p) for p in parts], layout=getattr(torch, layout)
            )
        else:
            raise ValueError(
                f"key {key!r}: an encoding has 3 parts (a tensor) or 2 (a nested tensor), got {len(encoded)}"
            )
    return TensorDict(tensors, batch_size=batch_size, device=device)
