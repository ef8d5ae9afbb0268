"""The bad-input catalogue (docs/reliability.md): each mistake gives one clear message, at once, before Ray starts.

Covered elsewhere: unknown config key, wrong type and impossible batch arithmetic (tests/trainer/test_config.py,
tests/test_main_cli.py), GPUs requested where there are none (test_config.py::test_resolve_device), a missing
custom reward file (tests/data/test_data_reward.py::test_load_custom_compute_score).
"""

import pytest
import torch
from transformers import DistilBertConfig

from config import ConfigError, load_config
from data.builtin import build_char_tokenizer
from data.dataset import RLHFDataset
from data.reward import RewardError, RewardManager
from trainer.build import build_trainer
from single_controller import DataProto
from tests.reliability.conftest import REPO, run_child, tiny_overrides


def build(tmp_path, assets, *overrides: str):
    # the demo's settings, also where an override names a model or data (which would pick verl's defaults)
    return build_trainer(load_config([*tiny_overrides(tmp_path, assets), *overrides], config_name="demo"))


@pytest.mark.parametrize(
    "override, expected",
    [
        ("actor_rollout_ref.model.path=/no/such/model",
         ["actor_rollout_ref.model.path='/no/such/model': no such directory", "Hugging Face model directory"]),
        ("data.train_files=/no/such/train.parquet",
         ["data.train_files='/no/such/train.parquet': data file not found"]),
        ("data.prompt_key=question",
         ["prompt key 'question' not found", "its columns are ['data_source', 'prompt'", "Set data.prompt_key"]),
        ("data.max_prompt_length=1",
         ["all 64 prompts", "longer than max_prompt_length=1 tokens (the shortest has",
          "raise data.max_prompt_length"]),
    ],
    ids=["model-path-missing", "dataset-file-missing", "prompt-key-missing", "every-prompt-too-long"],
)
def test_bad_paths_and_data_name_the_key_and_what_is_valid(tmp_path, assets, override, expected):
    with pytest.raises(ConfigError) as info:
        build(tmp_path, assets, override)
    message = str(info.value)
    assert "\n" not in message
    for part in expected:
        assert part in message


def test_a_model_that_is_not_a_causal_lm_is_refused(tmp_path, assets):
    DistilBertConfig(dim=32, n_layers=1, n_heads=2, hidden_dim=64).save_pretrained(tmp_path / "encoder")
    with pytest.raises(ConfigError, match=r"a 'distilbert' model is not a causal LM.*AutoModelForCausalLM"):
        build(tmp_path, assets, f"actor_rollout_ref.model.path={tmp_path / 'encoder'}")


def test_the_command_line_reports_a_data_mistake_in_one_line(tmp_path, assets):
    run = run_child([str(REPO / "main.py"), *tiny_overrides(tmp_path, assets), "data.prompt_key=question"],
                    cwd=tmp_path, timeout_s=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("colorl: config error: data.train_files=")
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing ran, nothing was written


def test_a_tokenizer_without_pad_token_pads_with_eos(tmp_path):
    tokenizer = build_char_tokenizer()
    tokenizer.pad_token = None
    (tmp_path / "p.jsonl").write_text('{"prompt": "ab"}\n{"prompt": "abcd"}\n')
    dataset = RLHFDataset(str(tmp_path / "p.jsonl"), tokenizer, max_prompt_length=6)
    batch = dataset.collate_fn([dataset[0], dataset[1]])
    assert dataset.pad_token_id == tokenizer.eos_token_id
    assert batch["input_ids"][0, :4].eq(tokenizer.eos_token_id).all() and batch["attention_mask"][0, :4].eq(0).all()


def test_a_raising_reward_function_is_named_with_its_row():
    tokenizer = build_char_tokenizer()

    def my_score(data_source, solution_str, ground_truth, extra_info=None):
        raise KeyError("answer")

    ids = torch.tensor(tokenizer(["ab", "cd"], add_special_tokens=False)["input_ids"])
    data = DataProto.from_dict(
        {"responses": ids, "response_mask": torch.ones_like(ids)},
        non_tensors={"data_source": ["mine", "mine"], "reward_model": [{"ground_truth": "x"}] * 2},
    )
    with pytest.raises(RewardError, match=r"reward function 'my_score' raised KeyError: 'answer' \(row 0, "
                                          r"data_source='mine', response='ab'\)"):
        RewardManager(tokenizer, compute_score=my_score)(data)
