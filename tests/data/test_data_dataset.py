"""RLHFDataset: loading, filtering, errors, left padding and the seeded dataloader."""

import json

import numpy as np
import pytest
import torch

from data.builtin import write_parquet
from data.dataset import RLHFDataset, make_dataloader


def _rows(prompts):
    return [
        {"data_source": "colorl/copy", "prompt": p, "reward_model": {"ground_truth": p}, "extra_info": {"index": i}}
        for i, p in enumerate(prompts)
    ]


@pytest.fixture
def parquet_file(tmp_path):
    path = tmp_path / "a.parquet"
    write_parquet(_rows(["c1>", "c12345>", "c123>", "c1234567890>"]), path)
    return str(path)


def test_overlong_prompts_are_filtered_and_counted(parquet_file, char_tokenizer):
    ds = RLHFDataset(parquet_file, char_tokenizer, max_prompt_length=7)
    assert len(ds) == 3 and ds.num_filtered == 1
    with pytest.raises(ValueError, match="1 of 4 prompts"):
        RLHFDataset(parquet_file, char_tokenizer, max_prompt_length=7, filter_overlong_prompts=False)
    with pytest.raises(ValueError, match=r"all 4 prompts.*max_prompt_length=2"):
        RLHFDataset(parquet_file, char_tokenizer, max_prompt_length=2)


@pytest.mark.parametrize("side, kept", [("left", "4567890>"), ("right", "c1234567"), ("middle", "c1237890>")])
def test_overlong_prompts_are_truncated_as_data_truncation_says(parquet_file, char_tokenizer, side, kept):
    width = 9 if side == "middle" else 8
    ds = RLHFDataset(
        parquet_file, char_tokenizer, max_prompt_length=width, filter_overlong_prompts=False, truncation=side
    )
    assert len(ds) == 4 and ds.num_filtered == 0
    assert char_tokenizer.decode(ds[3]["input_ids"]) == kept  # "c1234567890>" cut to its width


def test_max_samples_keeps_the_first_prompts(parquet_file, char_tokenizer):
    ds = RLHFDataset(parquet_file, char_tokenizer, max_prompt_length=16, max_samples=2)
    assert [char_tokenizer.decode(row["input_ids"]) for row in ds] == ["c1>", "c12345>"]


def test_parquet_and_jsonl_files_are_concatenated(parquet_file, tmp_path, char_tokenizer):
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in _rows(["c9>", "c98>"])))
    ds = RLHFDataset([parquet_file, str(jsonl)], char_tokenizer, max_prompt_length=16)
    assert [row["raw_prompt"] for row in ds] == ["c1>", "c12345>", "c123>", "c1234567890>", "c9>", "c98>"]


def test_missing_file_and_missing_key_are_named(parquet_file, tmp_path, char_tokenizer):
    missing = str(tmp_path / "nope.parquet")
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        RLHFDataset([parquet_file, missing], char_tokenizer)
    with pytest.raises(ValueError, match=r"'question'.*a\.parquet.*'data_source'"):
        RLHFDataset(parquet_file, char_tokenizer, prompt_key="question")


def test_chat_messages_without_template_are_joined(tmp_path, char_tokenizer):
    path = tmp_path / "chat.jsonl"
    row = {"data_source": "x", "prompt": [{"role": "user", "content": "c12>"}], "reward_model": {"ground_truth": "12"}}
    path.write_text(json.dumps(row))
    ds = RLHFDataset(str(path), char_tokenizer, max_prompt_length=8)
    assert char_tokenizer.decode(ds[0]["input_ids"]) == "c12>"
    assert ds[0]["raw_prompt"] == row["prompt"]


def test_collate_left_pads_with_position_ids(parquet_file, char_tokenizer):
    ds = RLHFDataset(parquet_file, char_tokenizer, max_prompt_length=8)
    batch = ds.collate_fn([ds[0], ds[1]])
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["position_ids"].shape == (2, 8)
    assert batch["attention_mask"][0].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    assert batch["input_ids"][0, :5].eq(char_tokenizer.pad_token_id).all()
    assert char_tokenizer.decode(batch["input_ids"][0, 5:]) == "c1>"
    assert batch["position_ids"][0].tolist() == [0, 0, 0, 0, 0, 0, 1, 2]
    assert batch["position_ids"][1].tolist() == [0, 0, 1, 2, 3, 4, 5, 6]
    for key in ("data_source", "reward_model", "extra_info", "raw_prompt"):
        assert batch[key].dtype == object and batch[key].shape == (2,)
    assert batch["reward_model"][1] == {"ground_truth": "c12345>"}


def test_dataloader_order_is_seeded(tmp_path, char_tokenizer):
    write_parquet(_rows([f"c{i}>" for i in range(16)]), tmp_path / "16.parquet")
    ds = RLHFDataset(str(tmp_path / "16.parquet"), char_tokenizer, max_prompt_length=16)

    def order(seed):
        return sum(
            (b["raw_prompt"].tolist() for b in make_dataloader(ds, 2, shuffle=True, seed=seed, drop_last=False)), []
        )

    assert order(5) == order(5)  # two loaders, one seed: one order
    assert order(5) != order(6)  # another seed, another order (of 16! possible ones)
    assert order(5) != [row["raw_prompt"] for row in ds] and sorted(order(5)) == sorted(row["raw_prompt"] for row in ds)
    loader = make_dataloader(ds, 3, shuffle=False, drop_last=True)
    assert [len(b["raw_prompt"]) for b in loader] == [3] * 5
    assert isinstance(next(iter(loader))["input_ids"], torch.Tensor)


def test_dataloader_generator_state_replays_the_next_epoch(parquet_file, char_tokenizer):
    ds = RLHFDataset(parquet_file, char_tokenizer, max_prompt_length=16)
    loader = make_dataloader(ds, 4, shuffle=True, seed=1, drop_last=False)
    state = loader.sampler.generator.get_state()
    first = [np.asarray(b["raw_prompt"]).tolist() for b in loader]
    loader.sampler.generator.set_state(state)
    assert [np.asarray(b["raw_prompt"]).tolist() for b in loader] == first


def test_apply_chat_template_kwargs_reach_the_template(tmp_path, char_tokenizer):
    """data.apply_chat_template_kwargs (verl's key, e.g. enable_thinking=false) are the template's variables."""
    path = tmp_path / "chat.jsonl"
    row = {"data_source": "x", "prompt": [{"role": "user", "content": "c1>"}], "reward_model": {"ground_truth": "1"}}
    path.write_text(json.dumps(row))
    char_tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if flag %}2{% endif %}"
    plain = RLHFDataset(str(path), char_tokenizer, max_prompt_length=8)
    flagged = RLHFDataset(str(path), char_tokenizer, max_prompt_length=8, chat_template_kwargs={"flag": True})
    assert char_tokenizer.decode(plain[0]["input_ids"]) == "c1>"
    assert char_tokenizer.decode(flagged[0]["input_ids"]) == "c1>2"
