"""The bad-input catalogue (docs/reliability.md): each mistake gives one clear message, at once, before Ray starts.

Covered elsewhere: unknown config key, wrong type and impossible batch arithmetic (tests/trainer/test_config.py,
tests/test_main_cli.py), GPUs requested where there are none (test_config.py::test_resolve_device), a missing
custom reward file (tests/data/test_data_reward.py::test_load_custom_compute_score).
"""

import pandas as pd
import pytest
import torch
from transformers import DistilBertConfig

from config import ConfigError
from data.builtin import build_char_tokenizer
from data.dataset import RLHFDataset
from data.reward import RewardError, RewardManager
from planner import load_config
from single_controller import DataProto
from tests.reliability.conftest import REPO, run_child, tiny_overrides
from trainer.running.build import build_trainer


def build(tmp_path, assets, *overrides: str):
    # the demo's settings, also where an override names a model or data (which would pick verl's defaults)
    return build_trainer(load_config([*tiny_overrides(tmp_path, assets), *overrides], config_name="demo"))


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "actor_rollout_ref.model.path=/no/such/model",
            ["actor_rollout_ref.model.path='/no/such/model': no such directory", "Hugging Face model directory"],
        ),
        ("data.train_files=/no/such/train.parquet", ["data.train_files='/no/such/train.parquet': data file not found"]),
        (
            "data.prompt_key=question",
            ["prompt key 'question' not found", "its columns are ['data_source', 'prompt'", "Set data.prompt_key"],
        ),
        (
            "data.max_prompt_length=1",
            [
                "all 64 prompts",
                "longer than max_prompt_length=1 tokens (the shortest has",
                "raise data.max_prompt_length",
            ],
        ),
        (
            "data.reward_fn_key=source",
            [
                "data.train_files='",
                "reward fn key 'source' not found in ",
                "its columns are ['data_source', 'prompt'",
                "Set data.reward_fn_key to one of them",
            ],
        ),
        (
            "reward.reward_model.enable=true reward.reward_model.model_path=/no/such/rm",
            ["reward.reward_model.model_path='/no/such/rm': no such directory", "Hugging Face model directory"],
        ),
        (
            "actor_rollout_ref.model.lora_rank=4 actor_rollout_ref.model.target_modules=[q_prj,v_proj]",
            [
                "actor_rollout_ref.model.target_modules=['q_prj', 'v_proj']: ['q_prj'] match no layer of the model; "
                "its layers are named [",
                "'q_proj'",
                "or use 'all-linear'",
            ],
        ),
    ],
    ids=[
        "model-path-missing",
        "dataset-file-missing",
        "prompt-key-missing",
        "every-prompt-too-long",
        "reward-fn-key-missing",
        "reward-model-path-missing",
        "lora-target-typo",
    ],
)
def test_bad_paths_and_data_name_the_key_and_what_is_valid(tmp_path, assets, override, expected):
    with pytest.raises(ConfigError) as info:
        build(tmp_path, assets, *override.split())
    message = str(info.value)
    assert "\n" not in message
    for part in expected:
        assert part in message


def write_parquet(path, prompts) -> str:
    pd.DataFrame({"prompt": prompts, "reward_model": [{"ground_truth": "x"}] * len(prompts)}).to_parquet(path)
    return str(path)


BAD_FILES = {  # name -> (how to write it, what the line says after naming data.train_files and the file)
    "corrupt.parquet": (
        lambda p: p.write_bytes(b"PAR1" + bytes(range(200))),
        "cannot be read (ArrowInvalid: ",
        "expected a parquet file (as pandas.DataFrame.to_parquet",
    ),
    "malformed.jsonl": (
        lambda p: p.write_text('{"prompt": "ab"}\n{"prompt": "cd"\n'),
        "line 2 of ",
        "is not a JSON object (",
        "expected one JSON object per line",
    ),
    "empty.jsonl": (lambda p: p.write_text(""), "is empty (0 bytes); expected one prompt per row"),
    "no-rows.parquet": (lambda p: write_parquet(p, []), "holds no rows; expected one prompt per row"),
    "null-prompt.parquet": (
        lambda p: write_parquet(p, ["ab", None]),
        "row 1 of ",
        "its 'prompt' is None; expected a non-empty string or a list of chat messages",
    ),
    "numeric-prompt.jsonl": (
        lambda p: p.write_text('{"prompt": 12}\n'),
        "row 0 of ",
        "its 'prompt' is 12; expected a non-empty string or a list of chat messages",
    ),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_an_unreadable_empty_or_malformed_data_file_is_named(tmp_path, assets, name):
    write, *expected = BAD_FILES[name]
    write(tmp_path / name)
    with pytest.raises(ConfigError) as info:
        build(tmp_path, assets, f"data.train_files={tmp_path / name}")
    message = str(info.value)
    assert message.startswith(f"data.train_files='{tmp_path / name}': ") and "\n" not in message
    for part in expected:
        assert part in message


REWARD_FUNCTIONS = (
    "def none(**kw):\n    return None\ndef text(**kw):\n    return '1.0'\ndef pair(**kw):\n    return 1.0, {}\n"
)


@pytest.mark.parametrize("name, shown", [("none", "None"), ("text", "'1.0'"), ("pair", "(1.0, {})")])
def test_a_reward_function_that_returns_no_score_is_refused_before_any_model_loads(tmp_path, assets, name, shown):
    (tmp_path / "rewards.py").write_text(REWARD_FUNCTIONS)
    with pytest.raises(ConfigError) as info:
        build(
            tmp_path,
            assets,
            f"reward.custom_reward_function.path={tmp_path / 'rewards.py'}",
            f"reward.custom_reward_function.name={name}",
        )
    assert str(info.value) == (
        f"reward.custom_reward_function.name='{name}': returned {shown} for the first prompt (with an empty response); "
        "a reward function must return a number, or a dict with a numeric 'score' (and any other values)"
    )


def test_an_unwritable_output_directory_is_refused(tmp_path, assets):
    (tmp_path / "file").write_text("")
    with pytest.raises(
        ConfigError,
        match=rf"^trainer.default_local_dir='{tmp_path}/file/run': cannot write there "
        r"\(NotADirectoryError: Not a directory\); choose a directory this user can",
    ):
        build(tmp_path, assets, f"trainer.default_local_dir={tmp_path / 'file' / 'run'}")


def test_a_model_that_is_not_a_causal_lm_is_refused(tmp_path, assets):
    DistilBertConfig(dim=32, n_layers=1, n_heads=2, hidden_dim=64).save_pretrained(tmp_path / "encoder")
    with pytest.raises(ConfigError, match=r"a 'distilbert' model is not a causal LM.*AutoModelForCausalLM"):
        build(tmp_path, assets, f"actor_rollout_ref.model.path={tmp_path / 'encoder'}")


def test_the_command_line_reports_a_data_mistake_in_one_line(tmp_path, assets):
    run = run_child(
        [str(REPO / "main.py"), *tiny_overrides(tmp_path, assets), "data.prompt_key=question"],
        cwd=tmp_path,
        timeout_s=120,
    )
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


def two_responses(tokenizer) -> DataProto:
    ids = torch.tensor(tokenizer(["ab", "cd"], add_special_tokens=False)["input_ids"])
    return DataProto.from_dict(
        {"responses": ids, "response_mask": torch.ones_like(ids)},
        non_tensors={"data_source": ["mine", "mine"], "reward_model": [{"ground_truth": "x"}] * 2},
    )


def test_a_raising_reward_function_is_named_with_its_row():
    tokenizer = build_char_tokenizer()

    def my_score(data_source, solution_str, ground_truth, extra_info=None):
        raise KeyError("answer")

    with pytest.raises(
        RewardError,
        match=r"reward function 'my_score' raised KeyError: 'answer' \(row 0, "
        r"data_source='mine', response='ab'\); it failed on all 2 responses",
    ):
        RewardManager(tokenizer, compute_score=my_score)(two_responses(tokenizer))


def test_a_reward_function_failing_on_one_response_scores_it_0_and_the_batch_goes_on(capsys):
    tokenizer = build_char_tokenizer()

    def my_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 1.0, "part": 0.5} if solution_str == "ab" else None

    manager = RewardManager(tokenizer, compute_score=my_score)
    scores, extras = manager(two_responses(tokenizer))
    assert scores.sum(-1).tolist() == [1.0, 0.0] and manager.last_errors == 1
    assert extras == {"score": [1.0, 0.0], "part": [0.5, 0.0]}
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        "colorl: warning: reward function 'my_score' returned None; a reward function must return a number"
    )
    assert "(row 1, data_source='mine', response='cd'); scored 0, as 1 of 2 responses (reward/errors" in line
