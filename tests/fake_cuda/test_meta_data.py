"""``DataProto`` and the step store on device (``meta``) tensors: every op a worker or the driver applies to a batch
keeps the tensors where they are and reads no value from them. Indices and masks are the controller's, on the
host (a CPU index into device tensors is allowed, as on CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from planner.dataflow import Route
from single_controller.data_proto import DataProto  # the trainer's (the core's: data[i] is one row)
from workers.compute.step_store import ROWS, STEP, StepCall, StepStore

pytestmark = pytest.mark.fake_cuda

META = torch.device("meta")
B, R = 6, 3


def _meta_batch(**extra) -> DataProto:
    tensors = {"responses": torch.zeros(B, R, dtype=torch.long), "log_probs": torch.zeros(B, R), **extra}
    data = DataProto.from_dict(tensors, {"uid": np.arange(B)}, meta_info={"temperature": 1.0})
    return data.to(META)


def _on_meta(data: DataProto, rows: int) -> None:
    assert len(data) == rows
    assert all(t.device == META and t.shape[0] == rows for t in data.batch.values())


def test_data_proto_ops_keep_device_tensors():
    data = _meta_batch()
    _on_meta(data, B)
    _on_meta(data[2], 1)
    _on_meta(data[1:4], 3)
    _on_meta(data[[0, 2, 5]], 3)
    _on_meta(data[torch.tensor([5, 1])], 2)
    _on_meta(data[np.array([True, False] * 3)], 3)  # a host mask
    _on_meta(data.select(batch_keys=["responses"]), B)
    _on_meta(data.repeat(2, interleave=True), 2 * B)
    _on_meta(data.repeat(3, interleave=False), 3 * B)
    for part in data.chunk(3) + data.split(4):
        assert all(t.device == META for t in part.batch.values())
    _on_meta(DataProto.concat(data.chunk(2)), B)
    joined = data.union(DataProto.from_dict({"values": torch.zeros(B, R, device=META)}))
    assert set(joined.batch.keys()) == {"responses", "log_probs", "values"}
    popped = joined.pop(batch_keys=["values"])
    _on_meta(popped, B)
    _on_meta(joined.rename("log_probs", "old_log_probs"), B)
    padded = _meta_batch()
    padded.padding(2)
    _on_meta(padded, B + 2)
    for mini in data.make_iterator(mini_batch_size=2, epochs=1, seed=0):
        _on_meta(mini, 2)


def test_step_store_serves_device_sends_with_kept_host_tensors():
    """A routed phase's inputs: the keys it was sent (on the device) plus those an earlier phase kept here (the
    store keeps them on the host: its one copy per phase)."""
    store = StepStore()
    rows = torch.arange(B)
    keep = Route("rollout", send=(), fetch=(), keep=("responses",), give=(), writes=("responses",))
    call = DataProto.from_dict({ROWS: rows}, meta_info={STEP: StepCall("t1", keep)})
    store.outputs(call, {"responses": torch.zeros(B, R, dtype=torch.long)})
    fetch = Route("update", send=("advantages",), fetch=("responses",), keep=(), give=(), writes=())
    sent = DataProto.from_dict({ROWS: rows, "advantages": torch.zeros(B, R)}, meta_info={STEP: StepCall("t1", fetch)})
    sent.batch["advantages"] = sent.batch["advantages"].to(META)
    inputs = store.inputs(sent)
    assert inputs.batch["advantages"].device == META and inputs.batch["responses"].shape == (B, R)
