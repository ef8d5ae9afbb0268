"""Built-in demo assets: tokenizer round trip, idempotent cache, loadable through from_pretrained."""

import os

import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from data.builtin import build_char_tokenizer, prepare_builtin

TINY = dict(task="copy", num_train=64, num_val=8, sft_warmup_steps=2, hidden_size=32, num_layers=1, seed=0)


def test_char_tokenizer_round_trips_through_from_pretrained(tmp_path):
    build_char_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = tok("r6475>", add_special_tokens=False)["input_ids"]
    assert len(ids) == 6 and tok.unk_token_id not in ids
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == "r6475>"
    assert tok.padding_side == "left"
    assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token) == ("<pad>", "<bos>", "<eos>", "<unk>")
    batch = tok(["c1>", "c123>"], padding=True)
    assert batch["input_ids"][0][:2] == [tok.pad_token_id] * 2 and batch["attention_mask"][0] == [0, 0, 1, 1, 1]


def test_prepare_builtin_is_idempotent_and_loadable(tmp_path, capsys):
    paths = prepare_builtin(tmp_path, **TINY)
    assert "sft warm-up step 2/2" in capsys.readouterr().out
    stamp = os.path.getmtime(os.path.join(paths["model_path"], "config.json"))
    assert prepare_builtin(tmp_path, **TINY) == paths
    assert os.path.getmtime(os.path.join(paths["model_path"], "config.json")) == stamp
    assert "sft warm-up" not in capsys.readouterr().out

    model = AutoModelForCausalLM.from_pretrained(paths["model_path"])
    tok = AutoTokenizer.from_pretrained(paths["model_path"])
    assert model.config.tie_word_embeddings and model.config.hidden_size == 32
    assert next(model.parameters()).dtype == torch.float32
    assert model.config.vocab_size == len(tok) and model.config.max_position_embeddings >= 24
    assert pq.read_table(paths["train_files"]).num_rows == 64
    val = pq.read_table(paths["val_files"]).to_pylist()
    assert len(val) == 8 and val[0]["data_source"] == "colorl/copy"
    assert [d for d in os.listdir(tmp_path) if ".tmp-" in d] == []


def test_a_changed_setting_builds_a_new_directory(tmp_path):
    first = prepare_builtin(tmp_path, **{**TINY, "sft_warmup_steps": 0})
    second = prepare_builtin(tmp_path, **{**TINY, "sft_warmup_steps": 1})
    assert first["model_path"] != second["model_path"]
    assert len(os.listdir(tmp_path)) == 2
