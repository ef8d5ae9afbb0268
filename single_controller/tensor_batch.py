"""TensorBatch: the tensor storage of a DataProto.

A ``TensorBatch`` is a ``dict[str, Tensor]`` whose tensors share the size of dim 0 (the batch size, kept even
when the batch holds no tensor). It offers the part of ``TensorDict``'s interface that worker code uses on
``DataProto.batch`` (``batch_size``, ``keys()``, ``select``, ``exclude``, ``to``, ``clone``, row indexing,
``torch.cat``) and converts to and from a ``TensorDict`` without copying. It stays a plain dict of tensors,
not a ``TensorDict``, because a chunk of a DataProto must travel through Ray with only its own rows (see
``pack`` and docs/benchmarks.md, "DataProto storage").
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from single_controller.errors import ContractError

__all__ = ["TensorBatch", "cat", "is_tensordict", "pack", "unpack"]

RowIndex = slice | int | Sequence[int] | np.ndarray | torch.Tensor


def is_tensordict(value: Any) -> bool:
    """Whether ``value`` is a ``tensordict.TensorDictBase`` (without importing tensordict if unused)."""
    module = sys.modules.get("tensordict")
    return module is not None and isinstance(value, module.TensorDictBase)


class TensorBatch(dict):
    """A ``dict[str, Tensor]`` whose tensors all share the size of dim 0."""

    def __init__(self, tensors: dict[str, torch.Tensor] | None = None, batch_size: int | None = None):
        super().__init__()
        self._size = None if batch_size is None else int(batch_size)
        for key, value in (tensors or {}).items():
            self[key] = value

    @classmethod
    def from_tensordict(cls, td: Any) -> TensorBatch:
        """The tensors of a 1-d batched ``TensorDict``, shared (not copied)."""
        if len(td.batch_size) != 1:
            raise ContractError(
                f"a DataProto batch needs a TensorDict with one batch dimension, got batch_size={list(td.batch_size)}"
            )
        nested = [k for k, v in td.items() if is_tensordict(v)]
        if nested:
            raise TypeError(
                f"TensorDict keys {nested} hold nested TensorDicts or non-tensor data; a DataProto batch holds "
                "tensors only (DataProto.from_tensordict puts non-tensor data in non_tensor_batch and meta_info)"
            )
        return cls(dict(td.items()), batch_size=int(td.batch_size[0]))

    def to_tensordict(self) -> Any:
        """The same tensors (shared, not copied) in a ``tensordict.TensorDict``."""
        from tensordict import TensorDict

        return TensorDict(dict(self), batch_size=self.batch_size)

    @property
    def size(self) -> int | None:
        """The batch size, ``None`` while the batch has neither a tensor nor a declared size."""
        return self._size

    @property
    def batch_size(self) -> torch.Size:
        return torch.Size([self._size or 0])

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        if not isinstance(key, str):
            raise TypeError(f"batch keys are strings, got {key!r}; to select rows use batch[rows]")
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"batch[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
        if value.dim() == 0:
            raise ValueError(f"batch[{key!r}] is a 0-dim tensor; batch tensors need a batch dimension")
        if self._size is None:
            self._size = value.shape[0]
        elif value.shape[0] != self._size:
            sizes = {k: v.shape[0] for k, v in self.items()}
            raise ContractError(
                f"batch[{key!r}] has batch size {value.shape[0]} but the batch has size {self._size} "
                f"(sizes of the other keys: {sizes})"
            )
        super().__setitem__(key, value)

    def __getitem__(self, item: str | RowIndex) -> Any:
        """``batch["key"]`` is a tensor; ``batch[rows]`` (int, slice, indices, mask) a TensorBatch of those rows.

        An int keeps the batch dimension (one row), unlike ``TensorDict``.
        """
        if isinstance(item, str):
            return super().__getitem__(item)
        return self.rows(item)

    def rows(self, item: RowIndex) -> TensorBatch:
        size = self._size or 0
        if isinstance(item, (int, np.integer)):
            index = int(item) + (size if item < 0 else 0)
            if not 0 <= index < size:
                raise IndexError(f"row {item} out of range for a batch of size {size}")
            item = slice(index, index + 1)
        if isinstance(item, slice):
            return self.map(lambda t: t[item], size=len(range(*item.indices(size))))
        index = torch.as_tensor(np.asarray(item))
        rows = int(index.sum()) if index.dtype == torch.bool else index.numel()
        return self.map(lambda t: t[index], size=rows)

    def map(self, fn, size: int | None = None) -> TensorBatch:
        """A new TensorBatch with ``fn`` applied to every tensor (``size``: the new batch size, else read off)."""
        out = {k: fn(v) for k, v in self.items()}
        if size is None:
            size = next(iter(out.values())).shape[0] if out else self._size
        return TensorBatch(out, batch_size=size)

    # ------------------------------------------------------------------ TensorDict-style methods
    def select(self, *keys: str) -> TensorBatch:
        """The given keys only (tensors shared)."""
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"batch has no key(s) {missing}; it has {sorted(self)}")
        return TensorBatch({k: dict.__getitem__(self, k) for k in keys}, batch_size=self._size)

    def exclude(self, *keys: str) -> TensorBatch:
        """All keys but the given ones (tensors shared)."""
        return TensorBatch({k: v for k, v in self.items() if k not in keys}, batch_size=self._size)

    def to(self, device: str | torch.device) -> TensorBatch:
        return self.map(lambda t: t.to(device), size=self._size)

    def clone(self) -> TensorBatch:
        return self.map(torch.clone, size=self._size)

    def contiguous(self) -> TensorBatch:
        return self.map(lambda t: t.contiguous(), size=self._size)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """``torch.cat(batches)``: join along dim 0, key by key."""
        kwargs = kwargs or {}
        if func is torch.cat and kwargs.get("dim", args[1] if len(args) > 1 else 0) == 0:
            return cat(args[0])
        return NotImplemented


def cat(batches: Sequence[TensorBatch]) -> TensorBatch:
    """Join batches with the same keys along dim 0."""
    keys = set(batches[0])
    for i, b in enumerate(batches):
        if set(b) != keys:
            raise ContractError(f"cannot join batches: part {i} has keys {sorted(b)}, part 0 has {sorted(keys)}")
    tensors = {k: torch.cat([dict.__getitem__(b, k) for b in batches]) for k in batches[0]}
    return TensorBatch(tensors, batch_size=sum(b.size or 0 for b in batches))


# ---------------------------------------------------------------------------- pickling
def pack(batch: TensorBatch | None) -> dict[str, tuple[np.ndarray, str]] | None:
    """The tensors as numpy arrays, for pickling (``None`` for no batch).

    Ray's pickle-5 path moves numpy arrays out of band (one copy into the object store), and a
    contiguous copy of a view holds only its rows; a pickled torch view would carry its whole storage.
    """
    if batch is None:
        return None
    tensors = {}
    for key, t in batch.items():
        t = t.detach().cpu().contiguous()
        stored = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        tensors[key] = (stored.numpy(), str(t.dtype).removeprefix("torch."))
    return tensors


def unpack(tensors: dict[str, tuple[np.ndarray, str]] | None, size: int) -> TensorBatch | None:
    """Inverse of :func:`pack`."""
    if tensors is None:
        return None
    out = {}
    for key, (array, dtype) in tensors.items():
        # copy: arrays read from Ray's object store are read-only, and workers update batches in place
        t = torch.from_numpy(np.array(array, copy=True))
        out[key] = t.view(torch.bfloat16) if dtype == "bfloat16" else t
    return TensorBatch(out, batch_size=size)
