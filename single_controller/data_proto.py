"""DataProto: the batch that flows between the driver and the workers (import it from ``single_controller``).

A DataProto holds three things that share one leading (batch) dimension:

- ``batch``: tensors, in a :class:`~single_controller.tensor_batch.TensorBatch` (a dict that checks
  dim 0); a ``tensordict.TensorDict`` given as ``batch`` is converted to one;
- ``non_tensor_batch``: numpy object arrays (strings, dicts, ...), one entry per row;
- ``meta_info``: a free-form dict that travels with the batch (``metrics``, sampling params, ...).

Everything a worker group does with data (chunking over ranks, padding, concatenating the
answers) is expressed with the methods here.
"""

from __future__ import annotations

import copy
import io
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from single_controller.tensor_batch import TensorBatch, cat, is_tensordict, pack, unpack

__all__ = ["DataProto", "DataProtoConfig"]


def _as_object_array(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values
    arr = np.empty(len(values), dtype=object)
    arr[:] = list(values)
    return arr


def _merge_meta(metas: Sequence[dict]) -> dict:
    """Merge the meta_info of several parts: ``metrics`` become dict-of-lists, other keys must agree."""
    merged: dict[str, Any] = {}
    metrics: dict[str, list] = {}
    for meta in metas:
        for key, value in meta.items():
            if key == "metrics":
                parts = value if isinstance(value, list) else [value]
                for part in parts:
                    for name, v in part.items():
                        metrics.setdefault(name, []).extend(v if isinstance(v, list) else [v])
            elif key in merged and not _equal(merged[key], value):
                raise ValueError(f"Conflicting values for meta_info key {key!r}: {merged[key]!r} vs {value!r}")
            else:
                merged[key] = value
    if metrics:
        merged["metrics"] = metrics
    return merged


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
    return a == b


class _Switch(type):
    """``DataProtoConfig.auto_padding``: set explicitly, else read from the environment at each use."""

    _auto_padding: bool | None = None

    @property
    def auto_padding(cls) -> bool:
        if cls._auto_padding is not None:
            return cls._auto_padding
        env = os.environ.get("COLORL_AUTO_PADDING", os.environ.get("VERL_AUTO_PADDING", "1"))
        return env.lower() not in ("0", "false", "no")

    @auto_padding.setter
    def auto_padding(cls, value: bool | None) -> None:
        cls._auto_padding = None if value is None else bool(value)


class DataProtoConfig(metaclass=_Switch):
    """Process-wide switch: may worker-group dispatch pad a batch to a multiple of the ranks?

    On unless ``DataProtoConfig.auto_padding = False`` or ``COLORL_AUTO_PADDING``/``VERL_AUTO_PADDING``
    is ``0`` (setting ``None`` goes back to the environment). A batch's own ``meta_info["auto_padding"]``
    (``from_dict(..., auto_padding=...)``) wins.
    """

    auto_padding_key = "auto_padding"


@dataclass
class DataProto:
    """A batch of rows: tensors, numpy object arrays and shared meta information."""

    batch: TensorBatch | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if is_tensordict(self.batch):
            self.batch = TensorBatch.from_tensordict(self.batch)
        elif self.batch is not None and not isinstance(self.batch, TensorBatch):
            self.batch = TensorBatch(dict(self.batch))
        self.non_tensor_batch = {k: _as_object_array(v) for k, v in self.non_tensor_batch.items()}
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
        auto_padding: bool | None = None,
    ) -> DataProto:
        """Build from ``{name: tensor}`` and ``{name: list|ndarray}``; sizes of dim 0 must agree."""
        batch = TensorBatch(tensors) if tensors else None
        meta = dict(meta_info or {})
        if auto_padding is not None:
            meta[DataProtoConfig.auto_padding_key] = auto_padding
        return cls(batch=batch, non_tensor_batch=dict(non_tensors or {}), meta_info=meta)

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict | None = None, auto_padding: bool | None = None) -> DataProto:
        """Split one dict by value type: tensors go to ``batch``, numpy arrays to ``non_tensor_batch``."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, np.ndarray):
                non_tensors[key] = value
            else:
                raise ValueError(f"Unsupported type {type(value).__name__} for key {key!r}: use a Tensor or np.ndarray")
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding)

    def check_consistency(self) -> None:
        size = int(self.batch.batch_size[0]) if self.batch else None
        for key, value in self.non_tensor_batch.items():
            if size is None:
                size = len(value)
            if len(value) != size:
                raise ValueError(
                    f"non_tensor_batch[{key!r}] has length {len(value)} but the batch size is {size} "
                    f"(tensor keys: {list(self.batch or {})}, non-tensor keys: {list(self.non_tensor_batch)})"
                )

    def __len__(self) -> int:
        if self.batch:
            return int(self.batch.batch_size[0])
        if self.non_tensor_batch:
            return len(next(iter(self.non_tensor_batch.values())))
        return 0

    # ------------------------------------------------------------------ indexing
    def __getitem__(self, item: int | slice | Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        if isinstance(item, (int, np.integer)):
            index = int(item) + (len(self) if item < 0 else 0)
            if not 0 <= index < len(self):
                raise IndexError(f"index {item} out of range for a DataProto of length {len(self)}")
            return self._select_rows(slice(index, index + 1))
        if isinstance(item, slice):
            return self._select_rows(item)
        if isinstance(item, (list, tuple, np.ndarray, torch.Tensor)):
            idx = torch.as_tensor(np.asarray(item))
            if idx.dtype == torch.bool:
                if idx.numel() != len(self):
                    raise IndexError(f"boolean mask of length {idx.numel()} for a DataProto of length {len(self)}")
                idx = idx.nonzero().flatten()
            return self._select_rows(idx.long())
        raise TypeError(f"DataProto indices must be int, slice, list, ndarray or Tensor, not {type(item).__name__}")

    def _select_rows(self, rows: slice | torch.Tensor) -> DataProto:
        np_rows = rows if isinstance(rows, slice) else rows.numpy()
        batch = self.batch.rows(rows) if self.batch else None
        non_tensors = {k: v[np_rows] for k, v in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=self.meta_info)

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        return self[slice(start, end, step)]

    # ------------------------------------------------------------------ keys
    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A DataProto with a subset of keys (tensors are shared unless ``deepcopy``)."""
        self._check_keys(batch_keys, non_tensor_batch_keys, meta_info_keys)
        batch = self.batch
        if batch is not None and batch_keys is not None:
            batch = TensorBatch({k: batch[k] for k in batch_keys}, batch_size=len(self))
        non_tensors = self.non_tensor_batch
        if non_tensor_batch_keys is not None:
            non_tensors = {k: non_tensors[k] for k in non_tensor_batch_keys}
        meta = self.meta_info
        if meta_info_keys is not None:
            meta = {k: meta[k] for k in meta_info_keys}
        out = DataProto(batch=batch, non_tensor_batch=dict(non_tensors), meta_info=dict(meta))
        return copy.deepcopy(out) if deepcopy else out

    def pop(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> DataProto:
        """Remove keys from this DataProto (in place) and return them as a new one."""
        self._check_keys(batch_keys, non_tensor_batch_keys, meta_info_keys)
        tensors = {k: self.batch.pop(k) for k in batch_keys or []}
        non_tensors = {k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys or []}
        meta = {k: self.meta_info.pop(k) for k in meta_info_keys or []}
        return DataProto.from_dict(tensors, non_tensors, meta)

    def _check_keys(self, batch_keys, non_tensor_batch_keys, meta_info_keys) -> None:
        for kind, keys, have in (
            ("batch", batch_keys, self.batch or {}),
            ("non_tensor_batch", non_tensor_batch_keys, self.non_tensor_batch),
            ("meta_info", meta_info_keys, self.meta_info),
        ):
            missing = [k for k in keys or [] if k not in have]
            if missing:
                raise KeyError(f"{kind} has no key(s) {missing}; it has {sorted(have)}")

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        """Rename batch keys in place; returns self."""
        old = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old) != len(new):
            raise ValueError(f"rename needs as many new keys as old keys: {old} -> {new}")
        self._check_keys(old, None, None)
        for o, n in zip(old, new):
            self.batch[n] = self.batch.pop(o)
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge ``other`` into self (in place): equal sizes; a shared key must hold equal values."""
        if len(self) != len(other) and len(self) and len(other):
            raise ValueError(f"union needs equal batch sizes, got {len(self)} and {len(other)}")
        if other.batch:
            if self.batch is None:
                self.batch = TensorBatch()
            for key, value in other.batch.items():
                if key in self.batch and not torch.equal(self.batch[key], value):
                    raise ValueError(f"union: batch key {key!r} exists in both with different values")
                self.batch[key] = value
        for key, value in other.non_tensor_batch.items():
            if key in self.non_tensor_batch and not _equal(self.non_tensor_batch[key], value):
                raise ValueError(f"union: non_tensor_batch key {key!r} exists in both with different values")
            self.non_tensor_batch[key] = value
        self.meta_info = _merge_meta([self.meta_info, other.meta_info])
        return self

    # ------------------------------------------------------------------ splitting and joining
    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` equal parts (the length must divide; see :func:`pad_dataproto_to_divisor`)."""
        if chunks <= 0 or len(self) % chunks != 0:
            raise ValueError(
                f"cannot chunk a DataProto of size {len(self)} into {chunks} equal parts; "
                f"pad it first (pad_dataproto_to_divisor) or use a batch size divisible by {chunks}"
            )
        size = len(self) // chunks
        return [self[i * size : (i + 1) * size] for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive pieces of ``split_size`` rows; the last one may be shorter."""
        if split_size <= 0:
            raise ValueError(f"split_size must be positive, got {split_size}")
        return [self[i : i + split_size] for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Join along dim 0; ``meta_info['metrics']`` are merged into lists, other meta keys must agree."""
        if not data:
            raise ValueError("concat needs at least one DataProto")
        batch = cat([d.batch or TensorBatch() for d in data]) if data[0].batch else None
        non_tensors = {
            k: np.concatenate([d.non_tensor_batch[k] for d in data]) for k in data[0].non_tensor_batch
        }
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=_merge_meta([d.meta_info for d in data]))

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every row: ``aabbcc`` when ``interleave`` else ``abcabc``."""
        if interleave:
            rows = torch.arange(len(self)).repeat_interleave(repeat_times)
        else:
            rows = torch.arange(len(self)).repeat(repeat_times)
        return self._select_rows(rows)

    def to(self, device: str | torch.device) -> DataProto:
        """Move the tensors to ``device`` (in place); returns self."""
        if self.batch is not None:
            self.batch = self.batch.map(lambda t: t.to(device))
        return self

    def is_padding_enabled(self) -> bool:
        """Whether worker-group dispatch may pad this batch: its meta_info's say, else :class:`DataProtoConfig`."""
        return bool(self.meta_info.get(DataProtoConfig.auto_padding_key, DataProtoConfig.auto_padding))

    def padding(self, padding_size: int, padding_candidate: str = "last") -> None:
        """Append ``padding_size`` copies of the first or last row, in place (verl's ``DataProto.padding``).

        Worker-group dispatch does not use this: it pads a copy (:func:`pad_dataproto_to_divisor`).
        """
        if padding_candidate not in ("first", "last", ""):
            raise ValueError(f"padding_candidate must be 'first' or 'last', got {padding_candidate!r}")
        if padding_size <= 0:
            return
        if len(self) == 0:
            raise ValueError("cannot pad an empty DataProto")
        row = 0 if padding_candidate == "first" else len(self) - 1
        padded = self._select_rows(torch.cat([torch.arange(len(self)), torch.full((padding_size,), row)]))
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def make_iterator(
        self, mini_batch_size: int, epochs: int = 1, seed: int | None = None, shuffle: bool = True
    ) -> Iterator[DataProto]:
        """Yield ``epochs * len / mini_batch_size`` mini-batches, reshuffled each epoch (seeded)."""
        if mini_batch_size <= 0 or len(self) % mini_batch_size != 0:
            raise ValueError(f"mini_batch_size {mini_batch_size} must divide the batch size {len(self)}")
        generator = torch.Generator()
        if seed is not None:
            generator.manual_seed(seed)
        for _ in range(epochs):
            order = torch.randperm(len(self), generator=generator) if shuffle else torch.arange(len(self))
            for start in range(0, len(self), mini_batch_size):
                yield self._select_rows(order[start : start + mini_batch_size])

    # ------------------------------------------------------------------ serialisation
    def __getstate__(self) -> dict:
        # a chunk sends only its own rows, never the whole storage it is a view of (see tensor_batch.pack)
        return {"tensors": pack(self.batch), "size": len(self), "non_tensor_batch": self.non_tensor_batch, "meta_info": self.meta_info}

    def __setstate__(self, state: dict) -> None:
        self.batch = unpack(state["tensors"], state["size"])
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def save_to_disk(self, path: str) -> None:
        """Save tensors with ``torch.save`` (weights_only-safe) and the rest as JSON (no pickles)."""
        non_tensors = {k: v.tolist() for k, v in self.non_tensor_batch.items()}
        payload = {"tensors": dict(self.batch or {}), "json": json.dumps({"non_tensor_batch": non_tensors, "meta_info": self.meta_info})}
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        with open(path, "wb") as f:
            f.write(buffer.getvalue())

    @staticmethod
    def load_from_disk(path: str) -> DataProto:
        payload = torch.load(path, weights_only=True)
        rest = json.loads(payload["json"])
        return DataProto.from_dict(payload["tensors"], rest["non_tensor_batch"], rest["meta_info"])
