"""verl's DataProto API beyond the trainer's, on ColoRL's TensorBatch storage (no Ray): reordering and repeating
rows, unfolding columns, uneven chunks, the concat/union rules, TensorDict conversions, verl's encodings."""

import pickle

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from single_controller import DataProto, DataProtoConfig
from single_controller.errors import ContractError
from single_controller.protocol import (
    deserialize_single_tensor,
    deserialize_tensordict,
    fold_batch_dim,
    list_of_dict_to_dict_of_list,
    serialize_single_tensor,
    serialize_tensordict,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
)


@pytest.fixture
def padding_switch():
    yield DataProtoConfig
    DataProtoConfig.auto_padding = None


def rows(n: int = 6) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(n), "y": torch.arange(2 * n).view(n, 2)}, {"s": [f"s{i}" for i in range(n)]}, {"t": 1}
    )


# ---------------------------------------------------------------------------- rows
def test_reorder_is_in_place_and_keeps_meta():
    d = rows(4)
    d.reorder(torch.tensor([2, 0, 3, 1]))
    assert d.batch["x"].tolist() == [2, 0, 3, 1] and d.non_tensor_batch["s"].tolist() == ["s2", "s0", "s3", "s1"]
    assert d.batch["y"][0].tolist() == [4, 5] and d.meta_info == {"t": 1}


@pytest.mark.parametrize("counts", [[0, 2, 1], (0, 2, 1), np.array([0, 2, 1]), torch.tensor([0, 2, 1])])
def test_sample_level_repeat_takes_any_sequence_of_counts(counts):
    out = rows(3).sample_level_repeat(counts)
    assert out.batch["x"].tolist() == [1, 1, 2] and out.non_tensor_batch["s"].tolist() == ["s1", "s1", "s2"]
    with pytest.raises(ValueError, match="one count per row"):
        rows(3).sample_level_repeat([1, 2])


def test_unfold_column_chunks_cuts_split_keys_and_repeats_the_rest():
    d = DataProto.from_dict({"a": torch.arange(12).view(2, 6), "b": torch.tensor([7, 8])}, {"s": ["p", "q"]})
    out = d.unfold_column_chunks(3, split_keys=["a"])
    assert out.batch["a"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    assert out.batch["b"].tolist() == [7, 7, 7, 8, 8, 8] and out.non_tensor_batch["s"].tolist() == ["p"] * 3 + ["q"] * 3
    with pytest.raises(ValueError, match="splits into 4"):
        d.unfold_column_chunks(4, split_keys=["a"])


def test_select_idxs_takes_indices_and_masks():
    d = rows(4)
    assert d.select_idxs([3, 0]).batch["x"].tolist() == [3, 0]
    assert d.select_idxs([True, False, True, False]).non_tensor_batch["s"].tolist() == ["s0", "s2"]
    assert d.select_idxs(torch.tensor([1])).batch["x"].tolist() == [1]


def test_fold_and_unfold_batch_dim_are_inverse():
    d = rows(6)
    folded = fold_batch_dim(d, new_batch_size=2)
    assert folded.batch["y"].shape == (2, 3, 2) and folded.non_tensor_batch["s"].shape == (2, 3)
    back = unfold_batch_dim(folded, batch_dims=2)
    assert (
        torch.equal(back.batch["y"], d.batch["y"])
        and back.non_tensor_batch["s"].tolist() == d.non_tensor_batch["s"].tolist()
    )
    with pytest.raises(ValueError, match="must divide"):
        fold_batch_dim(d, new_batch_size=4)


# ---------------------------------------------------------------------------- construction and chunks
def test_from_dict_checks_num_batch_dims_then_keeps_one():
    t = {"a": torch.zeros(4, 3), "b": torch.zeros(4, 3, 2)}
    assert len(DataProto.from_dict(t)) == 4
    with pytest.raises(ContractError, match="one batch dim"):
        DataProto.from_dict(t, num_batch_dims=2)  # the shapes agree on 2 dims; a DataProto keeps one
    with pytest.raises(AssertionError, match="first 3 dims"):
        DataProto.from_dict(t, num_batch_dims=3)


def test_from_dict_makes_lists_numpy_object_arrays_as_verl():
    d = DataProto.from_dict(non_tensors={"pairs": [[1, 2], [3, 4]], "ragged": [[1], [2, 3]]})
    assert d.non_tensor_batch["pairs"].shape == (2, 2) and d.non_tensor_batch["ragged"].shape == (2,)
    assert d.non_tensor_batch["ragged"][1] == [2, 3]


def test_chunk_is_even_unless_padding_was_turned_on(padding_switch):
    d = rows(10)
    with pytest.raises(AssertionError, match="size 10 into 4"):
        d.chunk(4)  # nobody turned padding on: verl's default, equal parts only
    padding_switch.auto_padding = True
    assert [len(p) for p in d.chunk(4)] == [len(td) for td in TensorDict({"x": torch.arange(10)}, [10]).chunk(4)]
    assert [len(p) for p in rows(5).chunk(4)] == [2, 2, 1, 0]  # TensorDict.chunk's sizes; the last part empty
    padding_switch.auto_padding = None
    uneven = DataProto.from_dict({"x": torch.arange(3)}, auto_padding=True).chunk(2)
    assert [p.batch["x"].tolist() for p in uneven] == [[0, 1], [2]]


def test_empty_batch_keeps_its_size_through_pickle():
    d = DataProto(batch=TensorDict({}, batch_size=[5]))
    back = pickle.loads(pickle.dumps(d))
    assert len(back) == 5 and back.batch is not None and list(back.batch.keys()) == []
    assert len(DataProto(batch=None, non_tensor_batch=None)) == 0


def test_make_iterator_draws_the_rows_a_seeded_dataloader_draws():
    d = rows(8)
    plain = [b.batch["x"].tolist() for b in d.make_iterator(mini_batch_size=4, epochs=1)]
    assert plain == [[0, 1, 2, 3], [4, 5, 6, 7]]  # in order unless shuffle is asked for, as in verl
    shuffled = [
        b.batch["x"].tolist() for b in d.make_iterator(4, epochs=2, seed=3, dataloader_kwargs={"shuffle": True})
    ]
    loader = torch.utils.data.DataLoader(
        range(8), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    assert shuffled == [b.tolist() for _ in range(2) for b in loader]
    assert all(b.meta_info == {"t": 1} for b in d.make_iterator(4, epochs=1))


# ---------------------------------------------------------------------------- joining
def test_concat_gathers_metrics_and_names_a_conflict():
    parts = [
        DataProto.from_dict({"x": torch.zeros(1)}, meta_info=m)
        for m in ({"metrics": None, "k": 1}, {"metrics": [{"l": 1.0}], "k": 1}, {"metrics": {"l": [2.0, 3.0]}})
    ]
    assert DataProto.concat(parts).meta_info == {"metrics": {"l": [1.0, 2.0, 3.0]}, "k": 1}
    with pytest.raises(AssertionError, match="Conflicting values for meta_info key 'k': 1 vs 2"):
        DataProto.concat([parts[0], DataProto.from_dict({"x": torch.zeros(1)}, meta_info={"k": 2})])


def test_union_helpers_compare_deeply_and_merge_in_place():
    cycle_a, cycle_b = np.array([None], dtype=object), np.array([None], dtype=object)
    cycle_a[0], cycle_b[0] = cycle_a, cycle_b
    mine = {"n": np.array([1.0, np.nan]), "c": cycle_a}
    assert (
        union_numpy_dict(mine, {"n": np.array([1.0, np.nan]), "c": cycle_b, "new": np.ones(2)}) is mine
        and "new" in mine
    )
    with pytest.raises(AssertionError, match="`n` in tensor_dict1"):
        union_numpy_dict(mine, {"n": np.array([1.0, 2.0])})
    td = TensorDict({"a": torch.ones(2)}, [2])
    assert "b" in union_tensor_dict(td, TensorDict({"a": torch.ones(2), "b": torch.zeros(2)}, [2])).keys()
    with pytest.raises(ValueError, match="equal batch sizes"):
        union_tensor_dict(td, TensorDict({"a": torch.ones(3)}, [3]))
    assert list_of_dict_to_dict_of_list([{"a": 1}, {"a": 2}]) == {"a": [1, 2]}


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
