"""Where the driver is in the training data: the epoch, the batches drawn in it, and the sampler's RNG at its start.

Checkpoints save it (``state``) and a resumed run continues from it (``load``), so a resumed run draws the same
batches as a straight one, also after a step that drew several generation batches (dynamic sampling). Each batch
carries the epoch it was drawn in (the ``dataset_epoch`` column), which the run's ledger counts prompts by
(``trainer.state.ledger``).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

import numpy as np

from single_controller.data_proto import DataProto

EPOCH = "dataset_epoch"  # the non-tensor column of the epoch (0-based) each prompt was drawn in


class DataPosition:
    """The data position of ``dataloader``, advanced by iterating ``batches()``."""

    def __init__(self, dataloader: Any) -> None:
        self.dataloader = dataloader
        self.epoch, self.batch_in_epoch, self.epoch_start_rng = 0, 0, None

    def batches(self) -> Iterator[DataProto]:
        """Batches across epochs from the current position on, without end."""
        generator = getattr(self.dataloader.sampler, "generator", None)
        while True:
            if generator is not None:  # the sampler draws the epoch's order from this generator
                if self.epoch_start_rng is None:
                    self.epoch_start_rng = generator.get_state()
                else:
                    generator.set_state(self.epoch_start_rng)
            for batch_dict in islice(self.dataloader, self.batch_in_epoch, None):
                self.batch_in_epoch += 1
                batch = DataProto.from_single_dict(batch_dict)
                batch.non_tensor_batch[EPOCH] = np.full(len(batch), self.epoch, dtype=np.int64)
                yield batch
            self.epoch, self.batch_in_epoch, self.epoch_start_rng = self.epoch + 1, 0, None

    def epochs_drawn(self) -> float:
        """Passes over the data drawn so far (fractional within an epoch)."""
        return self.epoch + self.batch_in_epoch / len(self.dataloader)

    def epoch_size(self) -> int:
        """The prompts an epoch draws: the dataset's, less a last partial batch that ``drop_last`` leaves out."""
        size, batch_size = len(self.dataloader.dataset), self.dataloader.batch_size
        return size // batch_size * batch_size if self.dataloader.drop_last else size

    def drawn_in_epoch(self) -> list[int]:
        """The dataset indices of the prompts drawn so far in this epoch, in their order (the sampler's order of
        the epoch replayed from its RNG at the epoch's start; the sampler's RNG is left as it was)."""
        if self.batch_in_epoch == 0:
            return []
        generator = getattr(self.dataloader.sampler, "generator", None)
        saved = generator.get_state() if generator is not None else None
        try:
            if generator is not None and self.epoch_start_rng is not None:
                generator.set_state(self.epoch_start_rng)
            batches = islice(iter(self.dataloader.batch_sampler), self.batch_in_epoch)
            return [int(index) for batch in batches for index in batch]
        finally:
            if saved is not None:
                generator.set_state(saved)

    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "epoch_start_rng": self.epoch_start_rng}

    def load(self, state: dict[str, Any]) -> None:
        self.epoch, self.batch_in_epoch = state["epoch"], state["batch_in_epoch"]
        self.epoch_start_rng = state["epoch_start_rng"]
