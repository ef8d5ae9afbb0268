"""The actor's weights from the trainer's group to a rollout group of its own (``trainer.v1.trainer_mode=
separate_async``), one FSDP unit at a time: the path the vLLM engine takes them by (``fsdp.gathered_units``).

The trainer's ranks gather each unit together; rank 0 puts the unit's full tensors into Ray's object store, so the
driver holds one small reference per unit and no tensor. Each rollout rank then fetches the units in order and
copies its own shard of each into its actor (no collective among the rollout ranks): at most one unit's full tensors
beside its shards, on either side. A vLLM engine in the rollout group takes them from that actor before its next
generation, as it does in one group.
"""

from __future__ import annotations

from typing import Any

from single_controller.base.register import Dispatch, register
from workers.parallel import fsdp


class WeightSync:
    """Mixed into the actor's worker: ``export_weights`` on the trainer's group, ``import_weights`` on the rollout's.
    The worker has ``trained`` (its ``TrainedRole``) and ``rank``."""

    trained: Any
    rank: int

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_weights(self) -> list:
        """One object-store reference per FSDP unit of the actor's current weights (rank 0's list; the other ranks
        join each gather and return an empty one)."""
        import ray  # separate_async is a Ray run's alone (trainer.running.groups)

        units = []
        with self.trained.onloaded():
            for named in fsdp.gathered_units(self.trained.module):
                if self.rank == 0:
                    units.append(ray.put({name: tensor.detach().cpu() for name, tensor in named}))
        return units

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def import_weights(self, units: tuple) -> None:
        """Copy the units ``export_weights`` put (a tuple of references: Ray resolves only top-level arguments, so
        each unit is fetched when its turn comes) into this rank's shards of the actor."""
        import ray

        with self.trained.onloaded():
            fsdp.load_full_units(self.trained.module, (ray.get(ref) for ref in units))
