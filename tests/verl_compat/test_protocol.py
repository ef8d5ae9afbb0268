"""verl's DataProto API beyond the trainer's, on ColoRL's TensorBatch storage (no Ray): reordering, repeating and
selecting rows, padding to a divisor, unfolding columns, uneven chunks, the concat/union rules. The TensorDict form
and verl's tensor encodings: test_protocol_tensordict.py."""

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from verl_compat.protocol import (
    ContractError,
    DataProto,
    DataProtoConfig,
    DataProtoItem,
    fold_batch_dim,
    list_of_dict_to_dict_of_list,
    pad_dataproto_to_divisor,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
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
def test_an_int_index_is_verls_item_each_tensor_one_dim_less():
    d = rows(6)
    item = d[1]
    assert isinstance(item, DataProtoItem) and item.batch["x"].tolist() == 1 and item.meta_info is d.meta_info
    assert item.batch["y"].shape == d.batch["y"].shape[1:] and d[-1].non_tensor_batch["s"] == "s5"
    with pytest.raises(IndexError):
        d[6]
    assert isinstance(d[1:2], DataProto) and d[1:2].batch["x"].tolist() == [1]  # any other selection: rows


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


def test_verls_names_of_the_padding_switch(monkeypatch):
    """The door gives the switch verl's names: from_dict writes meta_info["_verl_auto_padding"], a batch carrying
    it by hand chooses for itself, and VERL_AUTO_PADDING chooses after COLORL_AUTO_PADDING."""
    assert DataProtoConfig.auto_padding_key == "_verl_auto_padding"
    assert DataProto.from_dict({"x": torch.arange(3)}, auto_padding=True).meta_info == {"_verl_auto_padding": True}
    by_hand = DataProto.from_dict({"x": torch.arange(3)}, meta_info={"_verl_auto_padding": True})
    assert [len(p) for p in by_hand.chunk(2)] == [2, 1]
    monkeypatch.delenv("COLORL_AUTO_PADDING", raising=False)
    monkeypatch.setenv("VERL_AUTO_PADDING", "0")
    assert DataProtoConfig.auto_padding is False and not rows(3).is_padding_enabled()
    monkeypatch.setenv("COLORL_AUTO_PADDING", "1")
    assert DataProtoConfig.auto_padding is True


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


# ---------------------------------------------------------------------------- padding for dispatch
@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("divisor", [1, 2, 3, 4, 7])
def test_pad_to_divisor_wraps_rows_from_the_start_and_unpad_undoes_it(n, divisor):
    d = DataProto.from_dict({"v": torch.arange(10, 10 + n)}, {"tag": [chr(97 + i) for i in range(n)]}, {"seed": 7})
    padded, pad = pad_dataproto_to_divisor(d, divisor)
    assert pad == (-n) % divisor and len(padded) == n + pad and len(d) == n  # the original is left as it was
    order = [i % n for i in range(n + pad)]  # more pad rows than rows: the batch comes round again
    assert padded.batch["v"].tolist() == [10 + i for i in order]
    assert padded.non_tensor_batch["tag"].tolist() == [chr(97 + i) for i in order] and padded.meta_info == {"seed": 7}
    back = unpad_dataproto(padded, pad)
    assert back.batch["v"].tolist() == d.batch["v"].tolist() and back.non_tensor_batch["tag"].tolist() == list(
        d.non_tensor_batch["tag"]
    )
    assert back.meta_info == {"seed": 7}


# ---------------------------------------------------------------------------- selections
@pytest.mark.parametrize(
    "index",
    [
        np.array([4, 0, 4]),
        torch.tensor([2, 1]),
        [3, 3, 0],
        np.array([False, True, True, False, True]),
        torch.tensor([True, False, False, False, True]),
        [True, True, False, False, False],
    ],
    ids=["np-int", "torch-int", "list-int", "np-bool", "torch-bool", "list-bool"],
)
def test_indexing_by_any_array_selects_those_rows_of_every_column(index):
    d = rows(5)
    picked = np.arange(5)[np.asarray(index)]  # numpy's reading of the same index
    out = d[index]
    assert out.batch["x"].tolist() == picked.tolist() and out.batch["y"].tolist() == d.batch["y"][picked].tolist()
    assert out.non_tensor_batch["s"].tolist() == [f"s{i}" for i in picked] and out.meta_info == {"t": 1}
    assert out.batch.batch_size == torch.Size([len(picked)]) and all(type(n) is int for n in out.batch.batch_size)
    assert [p.batch["x"].tolist() for p in out.chunk(len(picked))] == [[i] for i in picked]  # chunks as any batch


def test_a_batch_of_columns_only_selects_pops_and_counts():
    d = DataProto.from_dict(non_tensors={"q": ["u", "v", "w"], "r": [1, 2, 3]}, meta_info={"m": 1})
    assert d.batch is None and len(d) == 3 and len(DataProto(non_tensor_batch={})) == 0
    assert d.select(non_tensor_batch_keys=["q"]).non_tensor_batch["q"].tolist() == ["u", "v", "w"]
    taken = d.pop(non_tensor_batch_keys=["r"], meta_info_keys=["m"])
    assert taken.non_tensor_batch["r"].tolist() == [1, 2, 3] and taken.meta_info == {"m": 1}
    assert list(d.non_tensor_batch) == ["q"] and d.meta_info == {}


def test_pop_takes_meta_info_keys_too():
    d = rows(2)
    d.meta_info["lr"] = 0.1
    taken = d.pop(batch_keys=["y"], meta_info_keys=["lr"])
    assert list(taken.batch.keys()) == ["y"] and taken.meta_info == {"lr": 0.1}
    assert list(d.batch.keys()) == ["x"] and d.meta_info == {"t": 1}


def test_chunks_and_repeats_keep_the_meta_info():
    d = rows(6)
    assert [c.meta_info for c in d.chunk(3)] == [{"t": 1}] * 3
    assert d.repeat(3, interleave=False).meta_info == {"t": 1}
    assert d.sample_level_repeat([1] * 6).meta_info == {"t": 1}


class Tagged(DataProto):
    """A user's DataProto subclass: verl's constructors build the subclass, not a plain DataProto."""


def test_constructors_build_the_subclass_they_are_called_on():
    assert type(Tagged.from_single_dict({"a": torch.zeros(2)})) is Tagged
    assert type(Tagged.from_dict({"a": torch.zeros(2)})) is Tagged
    assert type(Tagged.from_dict({"a": torch.zeros(2)}).to_tensordict()) is TensorDict
    assert type(Tagged.from_tensordict(TensorDict({"a": torch.zeros(2)}, [2]))) is Tagged


# ---------------------------------------------------------------------------- unfolding columns
def test_unfold_column_chunks_splits_non_tensor_columns_and_higher_dims():
    pairs = DataProto.from_dict(
        {"img": torch.arange(24).view(2, 4, 3)},
        {"who": [["p0", "p1"], ["q0", "q1"]], "name": ["p", "q"]},
        {"t": 1},
    )
    out = pairs.unfold_column_chunks(2, split_keys=["img", "who"])
    assert out.batch["img"].shape == (4, 2, 3) and torch.equal(out.batch["img"].reshape(2, 4, 3), pairs.batch["img"])
    assert out.non_tensor_batch["who"].tolist() == [["p0"], ["p1"], ["q0"], ["q1"]]
    assert out.non_tensor_batch["name"].tolist() == ["p", "p", "q", "q"] and out.meta_info == {"t": 1}


def test_unfold_column_chunks_without_split_keys_repeats_everything():
    d = rows(2)
    out = d.unfold_column_chunks(3, split_keys=None)
    assert out.batch["y"].tolist() == [[0, 1]] * 3 + [[2, 3]] * 3
    assert out.non_tensor_batch["s"].tolist() == ["s0"] * 3 + ["s1"] * 3


# ---------------------------------------------------------------------------- joining (verl's concat rules)
def test_concat_keeps_every_parts_meta_keys_and_metrics_wherever_they_are():
    parts = [
        DataProto.from_dict({"x": torch.zeros(2)}, meta_info={"phase": "gen"}),  # the first part has no metrics
        DataProto.from_dict({"x": torch.ones(2)}, meta_info={"metrics": {"kl": 0.1}, "phase": "gen", "mb": 4}),
        DataProto.from_dict({"x": torch.ones(1)}, meta_info={"metrics": [{"kl": 0.3}, {"kl": 0.2}], "seed": 9}),
    ]
    assert DataProto.concat(parts).meta_info == {"phase": "gen", "mb": 4, "seed": 9, "metrics": {"kl": [0.1, 0.3, 0.2]}}


def test_union_tensor_dict_refuses_a_shared_key_with_other_values():
    left = TensorDict({"obs": torch.arange(3.0)}, [3])
    union_tensor_dict(left, TensorDict({"obs": torch.arange(3.0), "rew": torch.ones(3)}, [3]))  # equal: merged
    with pytest.raises(AssertionError, match="rew"):
        union_tensor_dict(left, TensorDict({"rew": torch.zeros(3)}, [3]))


def _cycle() -> np.ndarray:
    a = np.array([None], dtype=object)
    a[0] = a
    return a


@pytest.mark.parametrize(
    ("left", "right", "equal"),
    [
        (np.arange(24).reshape(2, 3, 4), np.arange(24).reshape(2, 3, 4), True),
        (np.arange(24).reshape(2, 3, 4), np.arange(24).reshape(2, 3, 4) * 2, False),
        (np.array([2.0, np.nan]), np.array([2.0, np.nan]), True),
        (np.array([2.0, np.nan]), np.array([np.nan, 2.0]), False),
        (np.array([float("nan"), "nan"], dtype=object), np.array([float("nan"), "nan"], dtype=object), True),
        (np.array([[np.arange(2), "w"], [None, 1.5]], dtype=object), None, True),  # None: a deep copy of left
        (
            np.array([[np.arange(2), "w"], [None, 1.5]], dtype=object),
            np.array([[np.arange(2), "w"], [None, 2.5]], dtype=object),
            False,
        ),
        (np.array([[[[np.arange(3)]]]], dtype=object), np.array([[[[np.arange(3) + 1]]]], dtype=object), False),
        (_cycle(), _cycle(), True),
        (_cycle(), np.array([None], dtype=object), False),
    ],
)
def test_union_numpy_dict_compares_columns_by_value(left, right, equal):
    import copy

    right = copy.deepcopy(left) if right is None else right
    if equal:
        assert union_numpy_dict({"c": left}, {"c": right})["c"] is right
    else:
        with pytest.raises(AssertionError, match="`c` in tensor_dict1"):
            union_numpy_dict({"c": left}, {"c": right})
