"""verl's ``verl.protocol``: the batch between the driver and the workers, with verl's whole API.

``DataProto`` here is the core's (single_controller/data_proto.py) with the methods only verl code uses:
``reorder``, ``sample_level_repeat``, ``unfold_column_chunks``, ``select_idxs``, ``to_tensordict`` /
``from_tensordict``, ``print_size``, ``print_summary`` and ``get_data_info``; ``data[i]`` is verl's single-row view,
a ``DataProtoItem`` (each tensor's row i, each column's value; the core's is a one-row DataProto). The module
functions ``fold_batch_dim`` / ``unfold_batch_dim`` reshape the batch dim, ``all_gather_data_proto`` gathers a
batch over ranks, and ``serialize_*`` / ``deserialize_*`` are verl's numpy encodings of tensors, as verl's do.
The core's pieces are here under verl's names too: ``DataProtoConfig`` and the padding helpers
(single_controller/padding.py), ``DataProtoFuture`` (future.py), ``union_tensor_dict`` and friends (merge.py),
``TensorBatch`` (tensor_batch.py).

TensorDict form of a DataProto (verl's): tensors as they are, each non-tensor column a ``NonTensorStack`` of
one ``NonTensorData`` per row (nested lists and dicts stay as they are), each meta_info entry a
``NonTensorData``. Both directions share the tensors (no copy); the way back rebuilds each column with its
dtype and shape (see :func:`column_from_rows`).

verl's encoding: a tensor is ``(dtype name, shape, its bytes as a uint8 numpy array)``, so any dtype travels,
bfloat16 and float8 included; a nested tensor ``(layout name, [encoding of each component])``; a TensorDict
``(batch_size, device or None, {key: encoding})``. The core's own pickling does not go through these
(single_controller/tensor_batch.py ``pack``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from single_controller.data_proto import DataProto as CoreDataProto
from single_controller.errors import ContractError
from single_controller.future import DataProtoFuture
from single_controller.merge import list_of_dict_to_dict_of_list, union_numpy_dict, union_tensor_dict
from single_controller.padding import DataProtoConfig, pad_dataproto_to_divisor, unpad_dataproto
from single_controller.tensor_batch import TensorBatch

__all__ = [
    "ContractError",
    "DataProto",
    "DataProtoConfig",
    "DataProtoFuture",
    "DataProtoItem",
    "TensorBatch",
    "all_gather_data_proto",
    "column_from_rows",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]


@dataclass
class DataProtoItem:
    """verl's single row of a DataProto (``data[i]``): ``batch`` maps each key to the tensor's row i (one dim less),
    ``non_tensor_batch`` each column to its value at i; ``meta_info`` is the batch's."""

    batch: dict[str, torch.Tensor] | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


class DataProto(CoreDataProto):
    """verl's DataProto: the core's, with verl's methods beyond what the trainer uses. Its own operations give
    back this class (the core builds results with ``type(self)``)."""

    def __getitem__(self, item: Any) -> Any:
        """verl's indexing: an int gives a ``DataProtoItem``; a slice, indices or a mask a DataProto (the core's)."""
        if not isinstance(item, (int, np.integer)):
            return super().__getitem__(item)
        row = super().__getitem__(item)  # one row, range-checked
        batch = None if row.batch is None else {key: value[0] for key, value in row.batch.items()}
        return DataProtoItem(batch, {key: value[0] for key, value in row.non_tensor_batch.items()}, row.meta_info)

    def reorder(self, indices: torch.Tensor) -> None:
        """Put the rows in the order ``indices`` gives, in place (meta_info unchanged)."""
        reordered = self._select_rows(torch.as_tensor(indices).long())
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def select_idxs(self, idxs: Any) -> Any:
        """The rows at ``idxs`` (indices or a boolean mask: list, ndarray or tensor)."""
        return self[idxs if not isinstance(idxs, list) else np.asarray(idxs)]

    def sample_level_repeat(self, repeat_times: Any) -> Any:
        """Row i repeated ``repeat_times[i]`` times (a list, tuple, 1-d ndarray or 1-d tensor of counts)."""
        counts = torch.as_tensor(
            np.asarray(repeat_times.tolist() if isinstance(repeat_times, torch.Tensor) else repeat_times)
        )
        if counts.dim() != 1 or counts.numel() != len(self):
            raise ContractError(f"repeat_times needs one count per row ({len(self)}), got shape {list(counts.shape)}")
        return self._select_rows(torch.arange(len(self)).repeat_interleave(counts.long()))

    def unfold_column_chunks(self, n_split: int, split_keys: list[str] | None = None) -> Any:
        """Cut dim 1 of the ``split_keys`` into ``n_split`` pieces that become rows; other keys repeat.

        Row i becomes rows ``i*n_split ... i*n_split + n_split - 1``: its k-th piece of every split key, and
        a copy of its value for every other key (meta_info unchanged).
        """
        split = set(split_keys or ())

        def unfold(value):
            if value.ndim < 2 or value.shape[1] % n_split:
                raise ContractError(
                    f"unfold_column_chunks: shape {list(value.shape)} has no dim 1 that splits into {n_split}"
                )
            return value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])

        rows = torch.arange(len(self)).repeat_interleave(n_split)
        repeated = self._select_rows(rows)
        if self.batch is not None:
            for key in split & set(self.batch):
                repeated.batch[key] = unfold(self.batch[key])
        for key in split & set(self.non_tensor_batch):
            repeated.non_tensor_batch[key] = unfold(self.non_tensor_batch[key])
        return repeated

    # ------------------------------------------------------------------ TensorDict
    def to_tensordict(self) -> Any:
        """This DataProto as one ``tensordict.TensorDict`` (verl's form; tensors shared, not copied)."""
        from tensordict import NonTensorData, NonTensorStack, TensorDict

        taken = set(self.batch or {})
        for kind, keys in (("non_tensor_batch", self.non_tensor_batch), ("meta_info", self.meta_info)):
            clash = sorted(taken & set(keys))
            if clash:
                raise ContractError(f"to_tensordict: keys {clash} of {kind} are taken by the tensors or the columns")
            taken |= set(keys)
        source = dict(self.batch or {})
        for key, column in self.non_tensor_batch.items():
            source[key] = NonTensorStack.from_list([NonTensorData(row) for row in column])
        for key, value in self.meta_info.items():
            source[key] = NonTensorData(value)
        return TensorDict(source, batch_size=[len(self)])

    @classmethod
    def from_tensordict(cls, tensor_dict: Any, meta_info: dict | None = None, num_batch_dims: int = 1) -> Any:
        """The inverse of :meth:`to_tensordict`: tensors to ``batch``, ``NonTensorStack`` entries to
        ``non_tensor_batch``, ``NonTensorData`` entries to ``meta_info`` (added to the given one)."""
        from tensordict import NonTensorData, NonTensorStack

        if num_batch_dims != 1:
            raise ContractError(f"num_batch_dims={num_batch_dims}: a DataProto has one batch dim")
        tensors, columns, meta = {}, {}, dict(meta_info or {})
        for key, value in tensor_dict.items():
            if isinstance(value, NonTensorStack):
                columns[key] = column_from_rows([row.data for row in value])
            elif isinstance(value, NonTensorData):
                meta[key] = value.data
            elif isinstance(value, torch.Tensor):
                tensors[key] = value
            else:
                raise TypeError(
                    f"from_tensordict: key {key!r} holds a {type(value).__name__}; a DataProto holds "
                    "tensors, NonTensorStack columns and NonTensorData meta entries"
                )
        return cls.from_dict(tensors, columns, meta)

    # ------------------------------------------------------------------ diagnostics
    def print_size(self, prefix: str = "") -> None:
        """Print the bytes held by the tensors and by the non-tensor arrays, in GB."""
        tensor_gb = sum(t.element_size() * t.numel() for t in (self.batch or {}).values()) / 1024**3
        array_gb = sum(a.nbytes for a in self.non_tensor_batch.values()) / 1024**3
        message = f"Size of tensordict: {tensor_gb} GB, size of non_tensor_batch: {array_gb} GB"
        print(f"{prefix}, {message}" if prefix else message)

    def print_summary(self, desc: str) -> None:
        """Print every key with its shape and type, between start/end markers naming ``desc``."""
        print(f"--- start of {desc} ---\n{self.get_data_info()}\n--- end of {desc} ---")

    def get_data_info(self) -> str:
        """One line per key: tensors with shape, dtype and device, arrays with shape and dtype, meta types."""
        lines = ["batch"]
        lines += [f"  {k}: {tuple(t.shape)} ({t.dtype}) {t.device}" for k, t in (self.batch or {}).items()]
        lines.append("non_tensor_batch")
        lines += [f"  {k}: ndarray{a.shape} ({a.dtype})" for k, a in self.non_tensor_batch.items()]
        lines.append("meta_info")
        lines += [f"  {k}: {type(v).__name__}" for k, v in self.meta_info.items()]
        return "\n".join(lines)


def column_from_rows(rows: list) -> np.ndarray:
    """The non-tensor column whose rows are ``rows``: the inverse of ``[column[i] for i in range(len(column))]``.

    Rows that are arrays of one shape and dtype are stacked (a 2-d column comes back 2-d), numpy scalars of
    one dtype make an array of that dtype (``int32`` stays ``int32``); anything else is an object array with
    one entry per row (lists stay lists).
    """
    if rows and all(isinstance(r, np.ndarray) for r in rows) and len({(r.shape, r.dtype) for r in rows}) == 1:
        return np.stack(rows)
    if rows and all(isinstance(r, np.generic) for r in rows) and len({r.dtype for r in rows}) == 1:
        return np.array(rows, dtype=rows[0].dtype)
    column = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):  # item by item: a slice assignment would broadcast equal-length lists
        column[i] = row
    return column


def fold_batch_dim(data: Any, new_batch_size: int) -> Any:
    """Rows ``[bsz, ...]`` -> ``[new_batch_size, bsz // new_batch_size, ...]``: consecutive rows grouped."""
    if new_batch_size <= 0 or len(data) % new_batch_size:
        raise ContractError(f"new_batch_size {new_batch_size} must divide the batch size {len(data)}")
    group = len(data) // new_batch_size
    return _reshaped(data, lambda value: value.reshape(new_batch_size, group, *value.shape[1:]))


def unfold_batch_dim(data: Any, batch_dims: int = 2) -> Any:
    """The first ``batch_dims`` dims of every tensor and column merged into one batch dim (undoes fold_batch_dim)."""
    return _reshaped(data, lambda value: value.reshape(-1, *value.shape[batch_dims:]))


def _reshaped(data: Any, reshape) -> Any:
    """A DataProto of ``data``'s type with ``reshape`` applied to every tensor and column (views where possible)."""
    tensors = {k: reshape(t) for k, t in (data.batch or {}).items()}
    columns = {k: reshape(a) for k, a in data.non_tensor_batch.items()}
    return type(data).from_dict(tensors, columns, data.meta_info)


def all_gather_data_proto(data: Any, process_group: Any = None) -> None:
    """Every rank's rows of ``data`` on every rank of ``process_group``, in rank order; in place, as verl's.

    Runs in the workers, inside ``torch.distributed``; the tensors come back on the device they were on.
    """
    import torch.distributed as dist

    parts = [None] * dist.get_world_size(group=process_group)
    dist.all_gather_object(parts, data, group=process_group)
    joined = type(data).concat(
        [type(data)(part.batch, part.non_tensor_batch) for part in parts]
    )  # meta_info stays this rank's
    device = next(iter(data.batch.values())).device if data.batch else None
    data.batch = joined.batch.to(device) if joined.batch is not None and device is not None else joined.batch
    data.non_tensor_batch = joined.non_tensor_batch


# ---------------------------------------------------------------------------- verl's encoding
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
