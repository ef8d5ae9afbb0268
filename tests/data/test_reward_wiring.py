"""trainer.running.build.build_trainer's reward wiring: several train/val files with different data sources mix,
validation reports each source, and reward.custom_reward_function.{path,name} replaces the built-in rewards (or is a
one-line ConfigError).

Generation is scripted (``ScriptedRollout`` answers from a table) so that no Ray worker starts; everything else
is the real path: config, parquet files, tokenizer from disk, datasets, reward managers, ``validate``.
"""

import pytest
import torch

from config import ConfigError
from data.builtin import write_parquet
from data.preprocess.gsm8k import preprocess
from data.tasks import make_splits
from planner import load_config
from single_controller import DataProto
from tests.data.gsm8k_fixture import printable_tokenizer, save_tiny_model, write_gsm8k
from trainer.running.build import build_trainer

COPY_VAL, GSM8K_VAL = "val-core/colorl/copy/reward/mean@1", "val-core/openai/gsm8k/reward/mean@1"


class ScriptedRollout:
    """Stands in for the rollout worker group: answers each prompt with ``answers[prompt token ids]`` + eos."""

    def __init__(self, tokenizer, answers: dict[tuple[int, ...], str], response_length: int) -> None:
        self.tokenizer, self.answers, self.response_length = tokenizer, answers, response_length

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """(B, P) prompts -> responses and response_mask (B, R), right-padded."""
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        responses = torch.full((len(prompts), self.response_length), self.tokenizer.pad_token_id)
        response_mask = torch.zeros((len(prompts), self.response_length), dtype=torch.long)
        for i in range(len(prompts)):
            text = self.answers[tuple(ids[i][mask[i].bool()].tolist())]
            row = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            responses[i, : len(row)] = torch.tensor(row)
            response_mask[i, : len(row)] = 1
        return DataProto.from_dict({"responses": responses, "response_mask": response_mask})


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny model with a chat-template tokenizer, and copy-task + GSM8K train/val parquet files."""
    root = tmp_path_factory.mktemp("wiring")
    copy_train, copy_val = make_splits("copy", 4, 3, seed=3)
    write_parquet(copy_train, root / "copy_train.parquet")
    write_parquet(copy_val, root / "copy_val.parquet")
    gsm8k = preprocess(write_gsm8k(root / "gsm8k_raw", "jsonl"), root / "gsm8k")
    return {
        "model": save_tiny_model(root / "model", printable_tokenizer()),
        "train": [str(root / "copy_train.parquet"), str(gsm8k["train"])],
        "val": [str(root / "copy_val.parquet"), str(gsm8k["test"])],
    }


def _trainer(assets, tmp_path, *overrides: str):
    cfg = load_config(
        [
            f"actor_rollout_ref.model.path={assets['model']}",
            "trainer.device=cpu",
            f"data.train_files=[{','.join(assets['train'])}]",
            f"data.val_files=[{','.join(assets['val'])}]",
            "data.max_prompt_length=256",
            "data.max_response_length=24",
            "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            f"trainer.default_local_dir={tmp_path}",
            *overrides,
        ],
        config_name="demo",
    )  # the demo's small settings around a user model and data
    return build_trainer(cfg)


def _script_answers(trainer, gsm8k_correct: int) -> None:
    """Copy prompts answered right; the first ``gsm8k_correct`` GSM8K prompts right (#### truth), others wrong."""
    answers, gsm8k_seen = {}, 0
    for row in trainer.val_dataloader.dataset.rows:
        truth = row["reward_model"]["ground_truth"]
        if row["data_source"] == "openai/gsm8k":
            answer = f"so #### {truth if gsm8k_seen < gsm8k_correct else int(truth) + 1}"
            gsm8k_seen += 1
        else:
            answer = truth
        answers[tuple(row["input_ids"])] = answer
    trainer.actor_rollout_wg = ScriptedRollout(trainer.tokenizer, answers, trainer.config.data.max_response_length)


def test_two_sources_mix_and_validate_per_source(assets, tmp_path):
    trainer = _trainer(assets, tmp_path)
    train_sources = [row["data_source"] for row in trainer.train_dataloader.dataset.rows]
    assert train_sources == ["colorl/copy"] * 4 + ["openai/gsm8k"] * 3  # the files, concatenated in order
    batch = next(iter(trainer.train_dataloader))
    assert batch["input_ids"].shape == (4, 256)
    _script_answers(trainer, gsm8k_correct=1)  # one of the two GSM8K test questions answered right
    metrics = trainer.validate()
    assert metrics == {COPY_VAL: pytest.approx(1.0), GSM8K_VAL: pytest.approx(0.5)}


def test_custom_reward_function_scores_train_and_val(assets, tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(
        "def length_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return len(solution_str) / 100 if data_source == 'openai/gsm8k' else 0.25\n"
    )
    trainer = _trainer(
        assets,
        tmp_path,
        f"reward.custom_reward_function.path={path}",
        "reward.custom_reward_function.name=length_score",
    )
    assert trainer.reward_fn.compute_score.__name__ == "length_score"
    assert trainer.val_reward_fn.compute_score is trainer.reward_fn.compute_score
    _script_answers(trainer, gsm8k_correct=2)  # "so #### 15" and "so #### 5": 10 and 9 characters
    assert trainer.validate() == {COPY_VAL: pytest.approx(0.25), GSM8K_VAL: pytest.approx(0.095)}


@pytest.mark.parametrize(
    "file_text, name, expected",
    [
        (None, "compute_score", r"^reward\.custom_reward_function\.path='.*missing\.py': no such file"),
        (
            "def other(*args):\n    return 0.0\n",
            "compute_score",
            r"^reward\.custom_reward_function\.name='compute_score': .*no function 'compute_score'; "
            r"callables in it: \['other'\]",
        ),
        (
            "import no_such_module_here\n",
            "compute_score",
            r"^reward\.custom_reward_function\.path='.*': importing it raised ModuleNotFoundError: No module named",
        ),
    ],
)
def test_bad_custom_reward_function_is_a_config_error(tmp_path, file_text, name, expected):
    path = tmp_path / ("missing.py" if file_text is None else "reward.py")
    if file_text is not None:
        path.write_text(file_text)
    cfg = load_config(
        [
            f"reward.custom_reward_function.path={path}",
            f"reward.custom_reward_function.name={name}",
            f"builtin.cache_dir={tmp_path / 'never_built'}",
        ]
    )
    with pytest.raises(ConfigError, match=expected) as error:
        build_trainer(cfg)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "never_built").exists()  # reported before any asset is built
