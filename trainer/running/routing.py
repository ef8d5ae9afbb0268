"""The driver's half of a step's routing: what it sends a worker phase and what it takes back from it.

The worker's half, which keeps a step's tensors where a later phase reads them, is ``workers.compute.step_store``;
each phase's ``Route`` (which keys are sent, fetched, kept and given back) is ``planner.dataflow``'s.
"""

from __future__ import annotations

import torch

from planner.dataflow import Route
from single_controller.data_proto import DataProto
from workers.compute.step_store import ROWS, STEP, StepCall

STEP_TOKEN = "step_token"  # meta_info key of the driver's batch: the token its worker calls carry (StepCall)


def request(batch: DataProto, token: str, route: Route, meta_info: dict | None = None) -> DataProto:
    """The driver's call of ``route``'s phase on ``batch``: each row's index, the keys the phase reads that the driver
    holds, and the non-tensor columns it reads that ``batch`` has; ``meta_info`` goes along (sampling settings)."""
    tensors = {ROWS: torch.arange(len(batch)), **{k: batch.batch[k] for k in route.send}}
    columns = {k: batch.non_tensor_batch[k] for k in route.columns if k in batch.non_tensor_batch}
    return DataProto.from_dict(tensors, columns, meta_info={**(meta_info or {}), STEP: StepCall(token, route)})


def take_back(batch: DataProto, route: Route, out: DataProto) -> None:
    """Into the driver's ``batch``, what ``route``'s phase answered: the keys it rewrote go, those it gave come in."""
    for key in route.writes:
        batch.batch.pop(key, None)
    batch.union(out)
