"""DataProto unit tests (no Ray)."""

import numpy as np
import pytest
import torch

from single_controller import DataProto
from single_controller.padding import DataProtoConfig, pad_dataproto_to_divisor, unpad_dataproto


def make(n: int = 6) -> DataProto:
    return DataProto.from_dict(
        {"obs": torch.arange(n * 2).view(n, 2).float(), "act": torch.arange(n)},
        {"label": [f"l{i}" for i in range(n)]},
        {"temperature": 1.0},
    )


def assert_same(a: DataProto, b: DataProto) -> None:
    assert a.batch.keys() == b.batch.keys() and a.non_tensor_batch.keys() == b.non_tensor_batch.keys()
    for k in a.batch:
        assert torch.equal(a.batch[k], b.batch[k])
    for k in a.non_tensor_batch:
        assert list(a.non_tensor_batch[k]) == list(b.non_tensor_batch[k])


def test_from_dict_and_len():
    d = make()
    assert len(d) == 6 and d.non_tensor_batch["label"].dtype == object
    with pytest.raises(ValueError, match="batch size"):
        DataProto.from_dict({"a": torch.zeros(3), "b": torch.zeros(4)})
    with pytest.raises(ValueError, match="length 4 but the batch size is 3"):
        DataProto.from_dict({"a": torch.zeros(3)}, {"x": ["a"] * 4})


def test_from_single_dict():
    d = DataProto.from_single_dict({"a": torch.zeros(2), "s": np.array(["x", "y"], dtype=object)})
    assert list(d.batch) == ["a"] and list(d.non_tensor_batch) == ["s"]
    with pytest.raises(ValueError, match="Unsupported type"):
        DataProto.from_single_dict({"a": [1, 2]})


@pytest.mark.parametrize("n_chunks", [1, 2, 3, 6])
def test_concat_of_chunks_is_identity(n_chunks):
    d = make()
    assert_same(DataProto.concat(d.chunk(n_chunks)), d)
    assert_same(DataProto.concat(d.split(4)), d)


def test_chunk_requires_divisibility():
    with pytest.raises(ValueError, match="size 6 into 4"):
        make().chunk(4)


def test_indexing():
    d = make()
    assert d[1].batch["act"].tolist() == [1]  # one row, as every selection: a DataProto
    assert d[-1].non_tensor_batch["label"].tolist() == ["l5"]
    assert d[1].batch["obs"].shape == (1, *d.batch["obs"].shape[1:]) and d[1].meta_info is d.meta_info
    with pytest.raises(IndexError):
        d[6]
    assert d[1:3].batch["act"].tolist() == [1, 2]
    assert d[[0, 5]].non_tensor_batch["label"].tolist() == ["l0", "l5"]
    mask = torch.tensor([True, False] * 3)
    assert d[mask].batch["act"].tolist() == [0, 2, 4]
    with pytest.raises(TypeError):
        d["obs"]


def test_select_pop_rename_union():
    d = make()
    s = d.select(batch_keys=["obs"], non_tensor_batch_keys=[])
    assert list(s.batch) == ["obs"] and s.batch["obs"].data_ptr() == d.batch["obs"].data_ptr()
    popped = d.pop(batch_keys=["act"])
    assert list(popped.batch) == ["act"] and "act" not in d.batch
    d.rename("obs", "observation")
    assert "observation" in d.batch
    d.union(popped)
    assert set(d.batch) == {"observation", "act"}
    with pytest.raises(ValueError, match="values differ"):
        d.union(DataProto.from_dict({"act": torch.zeros(6, dtype=torch.long)}))
    with pytest.raises(ValueError, match="equal batch sizes"):
        d.union(DataProto.from_dict({"z": torch.zeros(5)}))
    with pytest.raises(KeyError, match="no key"):
        d.select(batch_keys=["missing"])


def test_concat_merges_metrics_and_rejects_conflicts():
    a = DataProto.from_dict({"x": torch.zeros(1)}, meta_info={"metrics": {"loss": 1.0}, "t": 1})
    b = DataProto.from_dict({"x": torch.ones(1)}, meta_info={"metrics": {"loss": 2.0}, "t": 1})
    assert DataProto.concat([a, b]).meta_info == {"metrics": {"loss": [1.0, 2.0]}, "t": 1}
    c = DataProto.from_dict({"x": torch.ones(1)}, meta_info={"t": 2})
    with pytest.raises(ValueError, match="Conflicting values for meta_info key 't'"):
        DataProto.concat([a, c])


def test_repeat():
    d = DataProto.from_dict({"x": torch.tensor([1, 2])}, {"s": ["a", "b"]})
    assert d.repeat(2, interleave=True).batch["x"].tolist() == [1, 1, 2, 2]
    assert d.repeat(2, interleave=False).non_tensor_batch["s"].tolist() == ["a", "b", "a", "b"]


@pytest.mark.parametrize("n", range(1, 18))
def test_pad_and_unpad(n):
    d = make(n)
    padded, pad = pad_dataproto_to_divisor(d, 4)
    assert len(padded) % 4 == 0 and pad == (-n) % 4 and len(d) == n
    assert_same(unpad_dataproto(padded, pad), d)


def test_make_iterator_covers_every_row_each_epoch():
    d = make(8)
    batches = list(d.make_iterator(mini_batch_size=4, epochs=2, seed=0))
    assert len(batches) == 4
    for epoch in (batches[:2], batches[2:]):
        assert sorted(torch.cat([b.batch["act"] for b in epoch]).tolist()) == list(range(8))
    again = list(d.make_iterator(mini_batch_size=4, epochs=2, seed=0))
    assert all(torch.equal(x.batch["act"], y.batch["act"]) for x, y in zip(batches, again))
    with pytest.raises(ValueError, match="must divide"):
        next(d.make_iterator(mini_batch_size=3))


def test_to_device_and_pickle_roundtrip():
    import pickle

    d = make()
    d.batch["bf"] = torch.ones(6, dtype=torch.bfloat16)
    back = pickle.loads(pickle.dumps(d.chunk(2)[1]))
    assert_same(back, d.chunk(2)[1])
    back.batch["act"] += 1  # arrays from the object store are read-only; ours must be writable
    assert d.to("cpu") is d


def test_chunk_pickles_only_its_rows():
    import pickle

    d = DataProto.from_dict({"x": torch.zeros(1000, 1000)})
    assert len(pickle.dumps(d.chunk(10)[0], protocol=5)) < 0.2 * len(pickle.dumps(d, protocol=5))


def test_save_and_load(tmp_path):
    d = make()
    path = tmp_path / "batch.pt"
    d.save_to_disk(str(path))
    loaded = DataProto.load_from_disk(str(path))
    assert_same(loaded, d)
    assert loaded.meta_info == d.meta_info


def test_padding_choice_batch_first_then_the_environment(monkeypatch):
    """A batch's own auto_padding wins over COLORL_AUTO_PADDING; the environment turns uneven chunks on."""
    monkeypatch.setenv("COLORL_AUTO_PADDING", "1")
    assert [len(p) for p in DataProto.from_dict({"x": torch.arange(3)}).chunk(2)] == [2, 1]
    refused = DataProto.from_dict({"x": torch.arange(3)}, auto_padding=False)
    assert refused.meta_info == {DataProtoConfig.auto_padding_key: False}
    with pytest.raises(ValueError, match="size 3 into 2"):
        refused.chunk(2)
    monkeypatch.setenv("COLORL_AUTO_PADDING", "no")
    assert not DataProto.from_dict({"x": torch.arange(3)}).is_padding_enabled()
