"""verl's DataProto in its TensorDict form and verl's tensor encodings (no Ray): to_tensordict / from_tensordict
(tensors shared, columns and meta entries as tensordict's NonTensorStack / NonTensorData), serialize_*."""

import pickle

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from verl_compat import DataProto
from verl_compat.protocol import (
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)


# ---------------------------------------------------------------------------- TensorDict
def test_tensordict_round_trip_is_exact_and_shares_the_tensors():
    d = DataProto.from_dict(
        {"ids": torch.arange(8).view(4, 2), "lp": torch.randn(4, 3, dtype=torch.bfloat16)},
        {
            "turns": np.array([1, 2, 3, 4], dtype=np.int32),
            "acc": np.array([1.0, 0.0, 0.5, 1.0]),
            "pairs": [[1, 2], [3, 4], [5, 6], [7, 8]],
            "msgs": np.array([[{"r": "u"}], [], [{"r": "u"}, {"r": "a"}], [{"r": "u"}]], dtype=object),
            "tag": ["a", "b", "c", "d"],
        },
        {"step": 3, "temperature": 0.7},
    )
    td = d.to_tensordict()
    assert isinstance(td.get("turns"), NonTensorStack) and td["tag"] == ["a", "b", "c", "d"]
    assert isinstance(td.get("step"), NonTensorData) and td["step"] == 3
    assert td["ids"].data_ptr() == d.batch["ids"].data_ptr()  # shared, not copied
    back = DataProto.from_tensordict(td)
    assert back.batch["lp"].data_ptr() == d.batch["lp"].data_ptr() and back.meta_info == d.meta_info
    for key, column in d.non_tensor_batch.items():
        assert back.non_tensor_batch[key].dtype == column.dtype and back.non_tensor_batch[key].shape == column.shape, (
            key
        )
        assert back.non_tensor_batch[key].tolist() == column.tolist(), key


def test_tensordict_chunks_are_views_that_pickle_only_their_rows():
    td = TensorDict({"x": torch.randn(64, 256)}, batch_size=[64])
    parts = DataProto.from_tensordict(td).chunk(8)
    assert parts[3].batch["x"].data_ptr() == td["x"][24:32].data_ptr()  # views: no per-chunk copy of the batch
    assert parts[3].to_tensordict()["x"].data_ptr() == td["x"][24:32].data_ptr()
    assert len(pickle.dumps(parts[3])) < len(pickle.dumps(DataProto.from_tensordict(td))) / 6


def test_to_tensordict_refuses_a_key_in_two_places():
    d = DataProto.from_dict({"a": torch.zeros(2)}, {"b": ["x", "y"]}, {"b": 1})
    with pytest.raises(ValueError, match=r"keys \['b'\] of meta_info"):
        d.to_tensordict()


# ---------------------------------------------------------------------------- verl's encodings
@pytest.mark.parametrize(
    "t",
    [torch.randn(3, 4).bfloat16(), torch.tensor([[True, False]]), torch.zeros(0, 2), torch.arange(6).view(2, 3).t()],
)
def test_serialize_single_tensor_round_trips_any_dtype_and_layout(t):
    back = deserialize_single_tensor(serialize_single_tensor(t))
    assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)


def test_serialize_tensordict_keeps_batch_size_device_and_nested_tensors():
    nested = torch.nested.as_nested_tensor([torch.arange(2.0), torch.arange(3.0)], layout=torch.jagged)
    td = TensorDict({"a": torch.ones(2, 3, 4), "n": nested}, batch_size=[2], device="cpu")
    back = deserialize_tensordict(serialize_tensordict(td))
    assert back.batch_size == td.batch_size and str(back.device) == "cpu" and back["n"].layout == torch.jagged
    assert [t.tolist() for t in back["n"].unbind()] == [[0.0, 1.0], [0.0, 1.0, 2.0]]


# ---------------------------------------------------------------------------- TensorDict form
def test_from_tensordict_reads_a_tensordict_built_with_tensordicts_own_api():
    td = TensorDict(
        {
            "ids": torch.arange(6).view(3, 2),
            "source": NonTensorStack.from_list(["gsm8k", "math", "gsm8k"]),
            "turns": NonTensorStack(*(NonTensorData(v) for v in ([0.5], [], [0.1, 0.9]))),
            "step": NonTensorData(12),
        },
        batch_size=[3],
    )
    d = DataProto.from_tensordict(td, meta_info={"epoch": 1})
    assert d.batch["ids"].data_ptr() == td["ids"].data_ptr() and d.meta_info == {"epoch": 1, "step": 12}
    assert d.non_tensor_batch["source"].tolist() == ["gsm8k", "math", "gsm8k"]
    assert d.non_tensor_batch["turns"].shape == (3,) and d.non_tensor_batch["turns"].tolist() == [[0.5], [], [0.1, 0.9]]
    with pytest.raises(TypeError, match="key 'inner'"):
        DataProto.from_tensordict(TensorDict({"inner": TensorDict({"a": torch.zeros(3)}, [3])}, [3]))


def test_to_tensordict_rows_read_back_as_the_lists_and_dicts_they_were():
    scores = [[], [0.5, 0.8], [0.9]]
    extra = [{"acc": 1.0}, {"acc": 0.0, "len": 3}, {}]
    chat = [[{"role": "user", "content": "2+2"}], [], [{"role": "user"}, {"role": "assistant"}]]
    td = DataProto.from_dict({"r": torch.ones(3)}, {"scores": scores, "extra": extra, "chat": chat}).to_tensordict()
    assert [list(td["scores"][i]) for i in range(3)] == scores
    assert [dict(td["extra"][i]) for i in range(3)] == extra
    assert [[dict(m) for m in td["chat"][i]] for i in range(3)] == chat


@pytest.mark.parametrize("batch_size", [[4], [4, 3]])
def test_serialize_tensordict_keeps_every_dtype_bit_for_bit(batch_size):
    dtypes = [
        torch.float64,
        torch.float16,
        torch.int32,
        torch.uint8,
        torch.bool,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    ]
    source = torch.randn(*batch_size, 2) * 4
    td = TensorDict({str(dt): source.to(dt) for dt in dtypes}, batch_size=batch_size)
    back = deserialize_tensordict(serialize_tensordict(td))
    assert back.batch_size == torch.Size(batch_size) and set(back.keys()) == set(td.keys())
    for key in td.keys():
        assert back[key].dtype == td[key].dtype and back[key].shape == td[key].shape, key
        assert torch.equal(back[key].view(torch.uint8), td[key].view(torch.uint8)), key  # fp8 has no ==
