"""Results not there yet: ``DataProtoFuture`` (a ``blocking=False`` DataProto call), and joining per-rank results."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from single_controller.data_proto import DataProto
from single_controller.tensor_batch import is_tensordict

__all__ = ["DataProtoFuture", "concat_results"]


def concat_results(parts: Sequence[Any]) -> Any:
    """Join a data-parallel call's rank results: DataProtos by ``DataProto.concat``, TensorDicts by ``torch.cat``."""
    if all(isinstance(p, DataProto) for p in parts):
        return DataProto.concat(parts)
    if all(is_tensordict(p) for p in parts):
        return torch.cat(list(parts), dim=0)
    kinds = sorted({type(p).__name__ for p in parts})
    raise TypeError(f"a data-parallel method must return a DataProto (or a TensorDict) on every rank, got {kinds}")


@dataclass
class DataProtoFuture:
    """A DataProto that workers have not finished computing yet (``blocking=False`` calls).

    It holds the per-rank ObjectRefs. Passing it to a ``DP_COMPUTE_PROTO`` method sends each rank
    the refs it needs; the worker resolves them, so the driver never materialises the data.
    """

    futures: list
    keep: int | None = None  # trim to this many rows after concatenation (undo dispatch padding)
    part: tuple[int, int] | None = None  # (index, of) chunk to take after concatenation

    @staticmethod
    def concat(data: list) -> DataProtoFuture:
        """The future of the concatenation of these per-rank results (the constructor ported code calls)."""
        return DataProtoFuture(list(data))

    def chunk(self, chunks: int) -> list:
        """One piece per rank. When rank i needs exactly result i, the piece is that ObjectRef itself:
        Ray then resolves it before the task starts, so the worker never blocks waiting for it."""
        if self.keep is None and self.part is None and len(self.futures) == chunks:
            return list(self.futures)
        return [DataProtoFuture(self.futures, self.keep, (i, chunks)) for i in range(chunks)]

    def get(self) -> DataProto:
        import ray

        data = concat_results(ray.get(self.futures))
        if self.keep is not None:
            data = data[: self.keep]
        if self.part is not None:
            index, chunks = self.part
            data = data.chunk(chunks)[index]
        return data
