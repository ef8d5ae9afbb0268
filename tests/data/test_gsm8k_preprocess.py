"""data.preprocess.gsm8k: every input layout to verl's row layout, clear errors, and the rows in RLHFDataset."""

import json

import pyarrow.parquet as pq
import pytest

from data.dataset import RLHFDataset
from data.preprocess.gsm8k import INSTRUCTION, main, preprocess
from tests.data.gsm8k_fixture import GSM8K, LAYOUTS, printable_tokenizer, write_gsm8k


def _rows(path):
    return pq.read_table(path).to_pylist()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_gives_verl_rows(tmp_path, layout):
    written = preprocess(write_gsm8k(tmp_path / "in", layout), tmp_path / "out")
    assert written == {"train": tmp_path / "out" / "train.parquet", "test": tmp_path / "out" / "test.parquet"}
    train, test = _rows(written["train"]), _rows(written["test"])
    assert [r["reward_model"]["ground_truth"] for r in train] == ["7", "2000", "6"]  # "#### 2,000" -> "2000"
    assert [r["reward_model"]["ground_truth"] for r in test] == ["15", "5"]
    question, answer = GSM8K["train"][1]["question"], GSM8K["train"][1]["answer"]
    assert train[1] == {
        "data_source": "openai/gsm8k",
        "prompt": [
            {
                "role": "user",
                "content": question + ' Let\'s think step by step and output the final answer after "####".',
            }
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "2000"},
        "extra_info": {"split": "train", "index": 1, "answer": answer, "question": question},
    }
    assert [r["extra_info"]["index"] for r in test] == [0, 1] and {r["extra_info"]["split"] for r in test} == {"test"}


def test_cli_writes_both_splits(tmp_path, capsys):
    main(["--local_dir", str(write_gsm8k(tmp_path / "in", "jsonl")), "--out_dir", str(tmp_path / "out")])
    assert "train: 3 rows" in capsys.readouterr().out
    assert len(_rows(tmp_path / "out" / "test.parquet")) == 2


def _cli_error(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("gsm8k: error: ") and len(err.strip().splitlines()) == 1
    return err


def test_cli_errors_are_one_line(tmp_path, capsys):
    out = str(tmp_path / "out")
    assert "no such directory" in _cli_error(capsys, "--local_dir", str(tmp_path / "nowhere"), "--out_dir", out)

    only_train = tmp_path / "only_train"
    only_train.mkdir()
    (only_train / "train.jsonl").write_text(json.dumps(GSM8K["train"][0]) + "\n")
    assert "no 'test' split" in _cli_error(capsys, "--local_dir", str(only_train), "--out_dir", out)
    main(["--local_dir", str(only_train), "--out_dir", out, "--splits", "train"])  # asking for train only is fine

    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for split in ("train", "test"):
        (renamed / f"{split}.jsonl").write_text(json.dumps({"problem": "q", "answer": "#### 1"}) + "\n")
    err = _cli_error(capsys, "--local_dir", str(renamed), "--out_dir", out)
    assert "no column 'question'" in err and "['problem', 'answer']" in err

    no_hashes = tmp_path / "no_hashes"
    no_hashes.mkdir()
    for split in ("train", "test"):
        (no_hashes / f"{split}.jsonl").write_text(json.dumps({"question": "q", "answer": "it is 4"}) + "\n")
    assert "train row 0" in _cli_error(capsys, "--local_dir", str(no_hashes), "--out_dir", str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()  # nothing written when a split fails


def test_rows_go_through_the_chat_template(tmp_path):
    written = preprocess(write_gsm8k(tmp_path / "in", "jsonl"), tmp_path / "out")
    question = GSM8K["test"][0]["question"]
    with_template = printable_tokenizer()
    row = RLHFDataset(str(written["test"]), with_template, max_prompt_length=256)[0]
    assert with_template.decode(row["input_ids"]) == f"<|user|>{question} {INSTRUCTION}<|assistant|>"
    assert row["data_source"] == "openai/gsm8k" and row["reward_model"]["ground_truth"] == "15"
    plain = printable_tokenizer(chat_template=None)
    row = RLHFDataset(str(written["test"]), plain, max_prompt_length=256)[0]
    assert plain.decode(row["input_ids"]) == f"{question} {INSTRUCTION}"
