"""DataProto: the batch that flows between the driver and the workers (import it from ``single_controller``).

A DataProto holds three things that share one leading (batch) dimension:

- ``batch``: tensors, in a :class:`~single_controller.tensor_batch.TensorBatch` (a dict that checks
  dim 0); a ``tensordict.TensorDict`` given as ``batch`` is converted to one (tensors shared);
- ``non_tensor_batch``: numpy arrays (strings, dicts, ... in object arrays), one entry per row;
- ``meta_info``: a free-form dict that travels with the batch (``metrics``, sampling params, ...).

Everything a worker group does with data (chunking over ranks, padding, concatenating the answers) is
expressed with the methods here.
"""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from single_controller.errors import ContractError
from single_controller.merge import merge_meta, union_numpy_dict, union_tensor_dict
from single_controller.padding import DataProtoConfig, padding_choice
from single_controller.tensor_batch import TensorBatch, cat, is_tensordict, pack, unpack

__all__ = ["DataProto"]


def _as_column(values: Any) -> np.ndarray:
    """A non-tensor column: arrays as given, any other sequence one object entry per row."""
    if isinstance(values, np.ndarray):
        return values
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):  # item by item: a slice assignment would broadcast equal-length lists
        column[i] = value
    return column


@dataclass
class DataProto:
    """A batch of rows: tensors, numpy arrays and shared meta information."""

    batch: TensorBatch | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if is_tensordict(self.batch):
            self.batch = TensorBatch.from_tensordict(self.batch)
        elif self.batch is not None and not isinstance(self.batch, TensorBatch):
            self.batch = TensorBatch(dict(self.batch))
        self.non_tensor_batch = {k: _as_column(v) for k, v in (self.non_tensor_batch or {}).items()}
        self.meta_info = self.meta_info if self.meta_info is not None else {}
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool | None = None,
    ) -> DataProto:
        """Build from ``{name: tensor}`` and ``{name: list|ndarray}``; the sizes of the batch dim must agree.

        A list becomes ``np.array(list, dtype=object)`` (a list of equal-length lists: a 2-d array).
        ``num_batch_dims``: how many leading dims the tensors must share (checked); a DataProto then keeps
        one batch dim, so anything but 1 is refused after the check.
        """
        tensors = dict(tensors or {})
        if num_batch_dims < 1:
            raise ContractError(f"num_batch_dims must be at least 1, got {num_batch_dims}")
        dims = {key: tuple(t.shape[:num_batch_dims]) for key, t in tensors.items()}
        if len(set(dims.values())) > 1:
            what = "batch size (dim 0)" if num_batch_dims == 1 else f"batch dims (the first {num_batch_dims} dims)"
            raise ContractError(f"the tensors disagree on the {what}: {dims}")
        if num_batch_dims != 1:
            raise ContractError(
                f"num_batch_dims={num_batch_dims}: a DataProto has one batch dim; fold the leading dims into "
                "dim 0 first (e.g. tensor.flatten(0, num_batch_dims - 1), or unfold_batch_dim)"
            )
        columns = {
            k: v if isinstance(v, np.ndarray) else np.array(v, dtype=object) for k, v in (non_tensors or {}).items()
        }
        meta = dict(meta_info or {})
        if auto_padding is not None:
            meta[DataProtoConfig.auto_padding_key] = auto_padding
        batch = TensorBatch(tensors) if tensors else None
        return cls(batch=batch, non_tensor_batch=columns, meta_info=meta)

    @classmethod
    def from_single_dict(
        cls, data: dict[str, Any], meta_info: dict | None = None, auto_padding: bool | None = None
    ) -> DataProto:
        """Split one dict by value type: tensors go to ``batch``, numpy arrays to ``non_tensor_batch``."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, np.ndarray):
                non_tensors[key] = value
            else:
                raise ValueError(f"Unsupported type {type(value).__name__} for key {key!r}: use a Tensor or np.ndarray")
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding=auto_padding)

    def check_consistency(self) -> None:
        """Every tensor and every non-tensor column has the same number of rows."""
        size = self.batch.size if self.batch is not None else None
        for key, value in self.non_tensor_batch.items():
            if size is None:
                size = len(value)
            if len(value) != size:
                raise ContractError(
                    f"non_tensor_batch[{key!r}] has length {len(value)} but the batch size is {size} "
                    f"(tensor keys: {list(self.batch or {})}, non-tensor keys: {list(self.non_tensor_batch)})"
                )

    def __len__(self) -> int:
        if self.batch is not None and self.batch.size is not None:
            return self.batch.size
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
        """These rows of every tensor and column (``meta_info`` shared): views for a slice, copies otherwise."""
        np_rows = rows if isinstance(rows, slice) else rows.numpy()
        batch = self.batch.rows(rows) if self.batch is not None else None
        non_tensors = {k: v[np_rows] for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=self.meta_info)

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
            batch = batch.select(*batch_keys)
        non_tensors = self.non_tensor_batch
        if non_tensor_batch_keys is not None:
            non_tensors = {k: non_tensors[k] for k in non_tensor_batch_keys}
        meta = self.meta_info
        if meta_info_keys is not None:
            meta = {k: meta[k] for k in meta_info_keys}
        out = type(self)(batch=batch, non_tensor_batch=dict(non_tensors), meta_info=dict(meta))
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
        return type(self).from_dict(tensors, non_tensors, meta)

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
        """Merge ``other`` into self (in place) and return self.

        Sizes must agree (a side without rows takes the other's); a key in both must hold equal values;
        meta_info merges as in :meth:`concat`.
        """
        if len(self) and len(other) and len(self) != len(other):
            raise ContractError(f"union needs equal batch sizes, got {len(self)} and {len(other)}")
        if other.batch is not None:
            mine = (
                self.batch
                if self.batch is not None and self.batch.size is not None
                else TensorBatch(batch_size=len(other))
            )
            self.batch = union_tensor_dict(mine, other.batch)
        union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        self.meta_info = merge_meta([self.meta_info, other.meta_info])
        return self

    # ------------------------------------------------------------------ splitting and joining
    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` parts along the rows; every part keeps ``meta_info``.

        A size that ``chunks`` does not divide is split only where padding was turned on (see
        single_controller/padding.py), into parts of ``ceil(len / chunks)`` rows each, the last ones
        shorter (or empty); otherwise it is an error.
        """
        n = len(self)
        if chunks <= 0:
            raise ContractError(f"chunks must be positive, got {chunks}")
        if n % chunks and padding_choice(self.meta_info) is not True:
            raise ContractError(
                f"cannot chunk a DataProto of size {n} into {chunks} equal parts; pad it first "
                f"(pad_dataproto_to_divisor), turn padding on (DataProtoConfig.auto_padding = True: then the parts "
                f"are uneven) or use a batch size divisible by {chunks}"
            )
        step = -(-n // chunks)
        return [self[min(i * step, n) : min((i + 1) * step, n)] for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive pieces of ``split_size`` rows; the last one may be shorter."""
        if split_size <= 0:
            raise ValueError(f"split_size must be positive, got {split_size}")
        return [self[i : i + split_size] for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Join along dim 0; ``meta_info`` merges by single_controller.merge.merge_meta (metrics gathered)."""
        if not data:
            raise ValueError("concat needs at least one DataProto")
        has_batch = [d.batch is not None for d in data]
        if any(has_batch) and not all(has_batch):
            raise ContractError(
                f"concat: parts {[i for i, b in enumerate(has_batch) if not b]} have no tensors, the others do"
            )
        batch = cat([d.batch for d in data]) if has_batch[0] else None
        non_tensors = {k: np.concatenate([d.non_tensor_batch[k] for d in data]) for k in data[0].non_tensor_batch}
        return type(data[0])(
            batch=batch, non_tensor_batch=non_tensors, meta_info=merge_meta([d.meta_info for d in data])
        )

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
            self.batch = self.batch.to(device)
        return self

    def is_padding_enabled(self) -> bool:
        """Whether worker-group dispatch may pad this batch: unless turned off (single_controller/padding.py)."""
        return padding_choice(self.meta_info) is not False

    def padding(self, padding_size: int, padding_candidate: str = "last") -> None:
        """Append ``padding_size`` copies of the first or last row, in place.

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
        self, mini_batch_size: int, epochs: int = 1, seed: int | None = None, dataloader_kwargs: dict | None = None
    ) -> Iterator[DataProto]:
        """``epochs * len / mini_batch_size`` mini-batches: a torch ``DataLoader`` over the rows.

        In order unless ``dataloader_kwargs={"shuffle": True}`` (drawn from a generator seeded with ``seed``,
        so the same seed gives the same mini-batches, run after run).
        """
        from torch.utils.data import DataLoader

        if mini_batch_size <= 0 or len(self) % mini_batch_size != 0:
            raise ContractError(f"mini_batch_size {mini_batch_size} must divide the batch size {len(self)}")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        loader = DataLoader(
            range(len(self)), batch_size=mini_batch_size, generator=generator, **(dataloader_kwargs or {})
        )

        def mini_batches() -> Iterator[DataProto]:
            for _ in range(epochs):
                for rows in loader:
                    yield self._select_rows(rows)

        return mini_batches()

    # ------------------------------------------------------------------ serialisation
    def __getstate__(self) -> dict:
        # a chunk sends only its own rows, never the whole storage it is a view of (see tensor_batch.pack)
        size = self.batch.size if self.batch is not None else None
        return {
            "tensors": pack(self.batch),
            "size": size,
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    def __setstate__(self, state: dict) -> None:
        self.batch = unpack(state["tensors"], state["size"])
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def save_to_disk(self, path: str) -> None:
        """Save tensors with ``torch.save`` (weights_only-safe) and the rest as JSON (no pickles)."""
        columns = {
            k: {"rows": v.tolist(), "dtype": str(v.dtype), "shape": list(v.shape)}
            for k, v in self.non_tensor_batch.items()
        }
        rest = json.dumps({"non_tensor_batch": columns, "meta_info": self.meta_info})
        buffer = io.BytesIO()
        torch.save({"tensors": dict(self.batch) if self.batch is not None else None, "json": rest}, buffer)
        with open(path, "wb") as f:
            f.write(buffer.getvalue())

    @classmethod
    def load_from_disk(cls, path: str) -> DataProto:
        payload = torch.load(path, weights_only=True)
        rest = json.loads(payload["json"])
        columns = {k: _column_from_json(**v) for k, v in rest["non_tensor_batch"].items()}
        tensors = payload["tensors"]
        batch = TensorBatch(tensors) if tensors else None
        return cls(batch=batch, non_tensor_batch=columns, meta_info=rest["meta_info"])


def _column_from_json(rows: list, dtype: str, shape: list[int]) -> np.ndarray:
    """The column :meth:`DataProto.save_to_disk` wrote: same dtype and shape (object rows kept as they were)."""
    if dtype != "object":
        return np.array(rows, dtype=dtype).reshape(shape)
    if len(shape) == 1:
        return _as_column(rows)
    return np.array(rows, dtype=object).reshape(shape)
