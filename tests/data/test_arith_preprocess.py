"""data.preprocess.arith: deterministic held-out splits in GSM8K's layout, correct ground truths, GSM8K's scorer
(strict score, flexible extra) through the default dispatch and the reward manager, and the rows in RLHFDataset."""

import re

import pyarrow.parquet as pq
import pytest

from data.dataset import RLHFDataset
from data.preprocess import gsm8k
from data.preprocess.arith import MAX_NUMBER, SYSTEM, main, make_splits, write_splits
from data.reward import RewardManager
from data.rewards.arith import DATA_SOURCE
from data.tasks import default_compute_score
from tests.data.gsm8k_fixture import printable_tokenizer, response_batch

SIZES = {"train": 300, "test": 100}
_SENTENCE_NUMBER = re.compile(r"\b(\d+)\b")


def _evaluate(expression: str) -> int:
    """``"23 + 5 - 7"`` -> 21, step by step (no eval)."""
    tokens = expression.split()
    total = int(tokens[0])
    for op, n in zip(tokens[1::2], tokens[2::2]):
        total = total + int(n) if op == "+" else total - int(n)
    return total


def test_splits_are_deterministic_and_held_out():
    splits = make_splits(SIZES, seed=5, max_steps=2, max_number=99)
    assert splits == make_splits(SIZES, seed=5, max_steps=2, max_number=99)
    assert splits != make_splits(SIZES, seed=6, max_steps=2, max_number=99)
    assert {split: len(rows) for split, rows in splits.items()} == SIZES
    expressions = [r["extra_info"]["answer"].split(" = ")[0] for rows in splits.values() for r in rows]
    assert len(set(expressions)) == len(expressions)  # no problem in both splits, none twice
    assert {len(e.split()) for e in expressions} == {3, 5}  # one and two steps


def test_rows_have_gsm8k_layout_and_correct_answers():
    rows = make_splits(SIZES, seed=1)["test"]
    reference = gsm8k.make_row("q", "a\n#### 3", "test", 0)
    for index, row in enumerate(rows):
        assert row.keys() == reference.keys() and row["extra_info"].keys() == reference["extra_info"].keys()
        assert row["reward_model"].keys() == reference["reward_model"].keys()
        assert row["data_source"] == DATA_SOURCE and row["extra_info"]["index"] == index
        question = row["extra_info"]["question"]
        assert row["prompt"] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        expression, result = row["extra_info"]["answer"].split("\n")[0].split(" = ")
        truth = row["reward_model"]["ground_truth"]
        assert truth == result == str(_evaluate(expression)) and int(truth) >= 0
        numbers = [int(n) for n in _SENTENCE_NUMBER.findall(question)]
        assert numbers == [int(n) for n in expression.split()[::2]]  # the story tells the expression
        assert all(1 <= n <= MAX_NUMBER for n in numbers)
        tokens = expression.split()
        for i in range(1, len(tokens) // 2 + 1):  # never below zero on the way
            assert _evaluate(" ".join(tokens[: 2 * i + 1])) >= 0


def test_gsm8k_scorer_strict_score_and_flexible_extra():
    row = make_splits({"test": 1}, seed=2)["test"][0]
    truth = row["reward_model"]["ground_truth"]
    wrong = str(int(truth) + 1)
    assert default_compute_score(DATA_SOURCE, f"so it is {truth}.\n#### {truth}", truth) == {
        "score": 1.0,
        "flexible": 1.0,
    }
    assert default_compute_score(DATA_SOURCE, f"#### {wrong}", truth) == {"score": 0.0, "flexible": 0.0}
    assert default_compute_score(DATA_SOURCE, f"The answer is {truth}.", truth) == {"score": 0.0, "flexible": 1.0}
    assert default_compute_score(DATA_SOURCE, "no idea", truth) == {"score": 0.0, "flexible": 0.0}


def test_reward_manager_puts_the_strict_score_on_the_tensor_and_flexible_in_the_extras():
    tok = printable_tokenizer()
    texts = ["#### 7", "it is 7", "#### 8"]
    data = response_batch(tok, texts, DATA_SOURCE, "7")
    reward, extra = RewardManager(tok)(data)
    assert reward.sum(-1).tolist() == [1.0, 0.0, 0.0]
    assert extra == {"score": [1.0, 0.0, 0.0], "flexible": [1.0, 1.0, 0.0]}


def test_cli_writes_parquet_that_rlhf_dataset_reads(tmp_path, capsys):
    main(["--out_dir", str(tmp_path), "--train_size", "20", "--test_size", "8", "--seed", "3"])
    assert "train: 20 rows" in capsys.readouterr().out
    rows = pq.read_table(tmp_path / "test.parquet").to_pylist()
    assert rows == make_splits({"train": 20, "test": 8}, seed=3)["test"]
    tok = printable_tokenizer()
    dataset = RLHFDataset(str(tmp_path / "test.parquet"), tok, max_prompt_length=512)
    assert len(dataset) == 8 and dataset[0]["data_source"] == DATA_SOURCE
    system, user = (m["content"] for m in rows[0]["prompt"])
    assert tok.decode(dataset[0]["input_ids"]) == f"<|system|>{system}<|user|>{user}<|assistant|>"


def test_cli_errors_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--out_dir", str(tmp_path), "--train_size", "15000", "--test_size", "0", "--max_steps", "1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("arith: error: only ") and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        main(["--out_dir", str(tmp_path), "--test_size", "-1"])
    assert "sizes must be >= 0" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_write_splits_leaves_no_staging_files(tmp_path):
    written = write_splits(make_splits({"train": 3, "test": 2}), tmp_path)
    assert (
        sorted(p.name for p in tmp_path.iterdir())
        == ["test.parquet", "train.parquet"]
        == sorted(p.name for p in written.values())
    )


def test_max_number_bounds_every_number():
    rows = make_splits({"train": 50}, seed=4, max_number=9)["train"]
    numbers = {int(n) for r in rows for n in _SENTENCE_NUMBER.findall(r["extra_info"]["question"])}
    assert numbers <= set(range(1, 10))
