"""benchmarks.generation_tail times ColoRL's decode loop step by step on a tiny model and prints one JSON object."""

import pytest

from benchmarks.generation_tail import fit
from data.preprocess.arith import make_splits, write_splits
from tests.benchmarks.runner import run_benchmark
from tests.data.gsm8k_fixture import printable_tokenizer, save_tiny_model


def test_fit_recovers_a_fixed_and_a_per_row_cost():
    fixed, per_row = fit([(rows, 0.5 + 0.25 * rows) for rows in (1, 2, 4, 8)])
    assert fixed == pytest.approx(0.5) and per_row == pytest.approx(0.25)


def test_generation_tail_times_every_decode_step(tmp_path):
    model = save_tiny_model(tmp_path / "model", printable_tokenizer())
    data = write_splits(make_splits({"train": 4}, seed=0), tmp_path / "arith")["train"]
    args = ("--prompts", "2", "--n", "2", "--response-length", "6", "--batches", "2", "--device", "cpu")
    out = run_benchmark("generation_tail", "--model", model, "--data", str(data), *args)
    assert out["rows"] == 4 and out["batches"] == 2
    # one prefill and at most response_length - 1 decode forwards per batch, each of at most the batch's rows
    assert 0 < out["decode_steps"] <= 2 * 5 and 0 < out["mean_rows_decoded"] <= 4
    assert 0 < out["live_fraction"] <= 1 and out["prefill_s"] > 0 and out["decode_s"] > 0
    assert out["bound"] < 1 and 0 <= out["bound_if_fixed"] < 1


def test_fit_of_steps_all_of_one_width_charges_each_row():
    assert fit([(4, 1.0), (4, 3.0)]) == (0.0, pytest.approx(0.5))
