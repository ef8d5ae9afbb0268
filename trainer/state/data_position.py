"""Where the driver is in the training data: the epoch, the batches drawn in it, and the sampler's RNG at its start.

Checkpoints save it (``state``) and a resumed run continues from it (``load``), so a resumed run draws the same
batches as a straight one, also after a step that drew several generation batches (dynamic sampling).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

from single_controller.data_proto import DataProto


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
                yield DataProto.from_single_dict(batch_dict)
            self.epoch, self.batch_in_epoch, self.epoch_start_rng = self.epoch + 1, 0, None

    def epochs_drawn(self) -> float:
        """Passes over the data drawn so far (fractional within an epoch)."""
        return self.epoch + self.batch_in_epoch / len(self.dataloader)

    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "epoch_start_rng": self.epoch_start_rng}

    def load(self, state: dict[str, Any]) -> None:
        self.epoch, self.batch_in_epoch = state["epoch"], state["batch_in_epoch"]
        self.epoch_start_rng = state["epoch_start_rng"]
