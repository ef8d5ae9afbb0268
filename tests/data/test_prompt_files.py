"""Prompt files read without ``datasets``: the same rows, order and columns as verl's ``datasets.load_dataset``
(the demo's parquet, a user's parquet with nested columns, JSON Lines whose rows differ in their keys), and the
RLHFDataset built on them unchanged."""

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.builtin import write_parquet
from data.dataset import RLHFDataset
from data.prompt_files import read_rows
from data.tasks import TASKS, make_splits

datasets = pytest.importorskip("datasets")  # the reference; ColoRL's own path does not need it

CHAT = [{"role": "system", "content": "Reason step by step."}, {"role": "user", "content": "What is 2+3?"}]
USER_ROWS = [  # verl's layout, as a preprocessor writes it: chat prompts, nested dicts, a list in a dict
    {
        "data_source": "openai/gsm8k",
        "prompt": CHAT,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "5"},
        "extra_info": {"split": "train", "index": i, "tools_kwargs": {"calc": {"create_kwargs": {"x": [i, 2]}}}},
    }
    for i in range(5)
]
JSON_LINES = [  # keys that some rows lack, nested dicts of differing keys, a column of mixed types
    {"prompt": "a1>", "data_source": "x", "extra_info": {"index": 0}},
    {"prompt": [{"role": "user", "content": "b"}], "reward_model": {"ground_truth": "7"}, "agent_name": "tool_agent"},
    {"prompt": "c3>", "data_source": "y", "extra_info": {"split": "val", "tools_kwargs": {}}, "score": "high"},
    {"prompt": "d4>", "score": 2},
]


def reference(path, builder: str) -> list[dict]:
    return list(datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=str(path) + ".cache"))


def assert_same_rows(ours: list[dict], theirs: list[dict], ordered: bool = True) -> None:
    """The same columns (in the same order: datasets orders those of JSON by how it typed them), the same rows."""
    order = list if ordered else sorted
    assert [order(row) for row in ours] == [order(row) for row in theirs]
    assert ours == theirs  # the same rows, in the same order


@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_demo_parquet_reads_as_datasets_reads_it(tmp_path, task):
    train, _ = make_splits(task, 24, 4, seed=3)
    write_parquet(train, tmp_path / "train.parquet")
    assert_same_rows(read_rows(str(tmp_path / "train.parquet"), {}), reference(tmp_path / "train.parquet", "parquet"))


@pytest.mark.parametrize("writer", ["pyarrow", "pandas", "datasets"])
def test_a_user_parquet_with_nested_columns_reads_as_datasets_reads_it(tmp_path, writer):
    path = tmp_path / "user.parquet"
    if writer == "pyarrow":
        pq.write_table(pa.Table.from_pylist(USER_ROWS), path)
    elif writer == "pandas":  # with an index of its own, which pandas stores as a column
        pd.DataFrame(USER_ROWS, index=range(10, 15)).to_parquet(path)
    else:
        datasets.Dataset.from_list(USER_ROWS).to_parquet(str(path))
    ours = read_rows(str(path), {"prompt": "data.prompt_key"})
    assert_same_rows(ours, reference(path, "parquet"))
    assert ours[3]["prompt"] == CHAT and ours[3]["extra_info"]["tools_kwargs"]["calc"]["create_kwargs"]["x"] == [3, 2]


def test_json_lines_whose_rows_differ_read_as_datasets_reads_them(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in JSON_LINES))
    ours = read_rows(str(path), {})
    assert_same_rows(ours, reference(path, "json"), ordered=False)
    path.write_text("\n\n".join(json.dumps(row) for row in JSON_LINES))  # blank lines are no rows
    assert_same_rows(read_rows(str(path), {}), ours)
    assert ours[3]["data_source"] is None and ours[0]["extra_info"] == {"index": 0}  # as written, none added
    listed = tmp_path / "listed.json"  # one JSON list of objects
    listed.write_text(json.dumps(JSON_LINES))
    assert_same_rows(read_rows(str(listed), {}), ours)


def test_the_dataset_keeps_every_prompt_in_file_order(tmp_path, char_tokenizer):
    """Rows, then files, in order; each prompt's non-tensor columns as its file holds them."""
    train, val = make_splits("copy", 12, 4, seed=5)
    write_parquet(train, tmp_path / "train.parquet")
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(row) + "\n" for row in val))
    files = [str(tmp_path / "train.parquet"), str(tmp_path / "val.jsonl")]
    dataset = RLHFDataset(files, char_tokenizer, max_prompt_length=64)
    assert [row["raw_prompt"] for row in dataset] == [row["prompt"] for row in train + val]
    assert [row["extra_info"] for row in dataset] == [row["extra_info"] for row in train + val]
    assert [row["reward_model"] for row in dataset] == [row["reward_model"] for row in train + val]
