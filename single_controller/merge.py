"""Joining the parts of DataProtos: union of tensors and of non-tensor columns, and the meta_info merge rule.

- ``union_tensor_dict`` / ``union_numpy_dict``: add the second dict's keys to the first; a key in both must
  hold equal values (``deep_equal`` for the numpy columns: NaN equals NaN, object arrays element by element).
- ``merge_meta``: the meta_info of parts joined by ``DataProto.concat`` (and ``union``): every part's
  ``"metrics"`` are gathered into one dict of lists, any other key must have one value across the parts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from single_controller.errors import ContractError

__all__ = [
    "deep_equal",
    "list_of_dict_to_dict_of_list",
    "merge_meta",
    "same_value",
    "union_numpy_dict",
    "union_tensor_dict",
]


def union_tensor_dict(tensor_dict1: Any, tensor_dict2: Any) -> Any:
    """Add ``tensor_dict2``'s tensors to ``tensor_dict1`` (in place; a TensorBatch or a TensorDict) and return it.

    Both must have the same batch size; a key in both must hold equal tensors.
    """
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ContractError(
            f"union needs equal batch sizes, got {list(tensor_dict1.batch_size)} and {list(tensor_dict2.batch_size)}"
        )
    for key in tensor_dict2.keys():
        value = tensor_dict2[key]
        if key not in tensor_dict1.keys():
            tensor_dict1[key] = value
        elif not tensor_dict1[key].equal(value):
            raise ContractError(f"{key} in tensor_dict1 and tensor_dict2 are not the same object: the values differ")
    return tensor_dict1


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add ``tensor_dict2``'s arrays to ``tensor_dict1`` (in place) and return it; a key in both must be deep-equal."""
    for key, value in tensor_dict2.items():
        if key in tensor_dict1 and not deep_equal(tensor_dict1[key], value):
            raise ContractError(f"`{key}` in tensor_dict1 and tensor_dict2 are not the same object. The values differ.")
        tensor_dict1[key] = value
    return tensor_dict1


def deep_equal(a: Any, b: Any, _on_path: set | None = None) -> bool:
    """``a == b`` for what a non-tensor column holds, with equal types throughout.

    NaN equals NaN; arrays are equal when dtype, shape and elements are (object arrays element by element,
    recursively); lists, tuples and dicts compare item by item; a structure that contains itself equals
    another one at the same place (the comparison stops at the cycle instead of recursing forever).
    """
    if type(a) is not type(b):
        return False
    on_path = set() if _on_path is None else _on_path
    pair = (id(a), id(b))
    if pair in on_path:
        return True
    on_path.add(pair)
    try:
        if isinstance(a, float):
            return a == b or (math.isnan(a) and math.isnan(b))
        if isinstance(a, np.ndarray):
            return _arrays_equal(a, b, on_path)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(deep_equal(x, y, on_path) for x, y in zip(a, b))
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(deep_equal(a[k], b[k], on_path) for k in a)
        if isinstance(a, torch.Tensor):
            return torch.equal(a, b)
        return bool(a == b)
    finally:
        on_path.discard(pair)


def _arrays_equal(a: np.ndarray, b: np.ndarray, on_path: set) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == object:
        return all(deep_equal(x, y, on_path) for x, y in zip(a.flat, b.flat))
    return np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")


def same_value(a: Any, b: Any) -> bool:
    """``a == b`` for meta_info values, where ``1 == 1.0`` as in Python, and tensors and arrays compare element-wise."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
    return a == b


def merge_meta(metas: Sequence[dict]) -> dict:
    """One meta_info for joined parts.

    ``"metrics"`` (a dict, or a list of dicts, per part; ``None`` counts as none) become one dict of lists, in
    part order; a list-valued metric is extended, so each metric stays one flat list (the trainer averages it).
    Any other key is kept once and must hold the same value in every part that has it.
    """
    merged: dict[str, Any] = {}
    metrics: dict[str, list] = {}
    for meta in metas:
        for key, value in meta.items():
            if key == "metrics":
                for part in value if isinstance(value, list) else [value] if value is not None else []:
                    for name, v in part.items():
                        metrics.setdefault(name, []).extend(v if isinstance(v, list) else [v])
            elif key in merged and not same_value(merged[key], value):
                raise ContractError(f"Conflicting values for meta_info key {key!r}: {merged[key]!r} vs {value!r}")
            else:
                merged[key] = value
    if metrics:
        merged["metrics"] = metrics
    return merged


def list_of_dict_to_dict_of_list(list_of_dict: Sequence[dict]) -> dict[str, list]:
    """``[{"a": 1}, {"a": 2}]`` -> ``{"a": [1, 2]}``; every dict may only use the first one's keys."""
    if not list_of_dict:
        return {}
    output: dict[str, list] = {key: [] for key in list_of_dict[0]}
    for i, row in enumerate(list_of_dict):
        for key, value in row.items():
            if key not in output:
                raise ContractError(f"dict {i} has key {key!r} that dict 0 lacks (dict 0 has {sorted(output)})")
            output[key].append(value)
    return output
