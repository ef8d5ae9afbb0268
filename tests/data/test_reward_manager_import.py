"""``reward.reward_manager.source=importlib``: a user's verl reward-manager class (``run_single`` on a one-row
DataProto), built from the config as verl builds it, scoring against a real judge over HTTP on loopback."""

import textwrap
import time
from pathlib import Path

import pytest
import torch

from benchmarks.judge import URL_VAR, async_judge_score, serve
from config import ConfigError
from data.reward import RewardManager
from data.reward_loop import ImportedRewardManager
from data.tasks import default_compute_score
from planner import load_config
from single_controller.data_proto import DataProto
from trainer.running.build import make_reward_manager

DELAY = 0.2
FATES = {"21": "ok", "2": "error", "1": "hang", "11": "nonsense"}  # the answer a row gives -> what the judge does

# what a verl user writes (verl's naive manager's reading of the row: data[0], the attention mask's response part),
# with the loop taken at construction as verl's RewardManagerBase does
MANAGER = """
import asyncio


class JudgedRewardManager:
    def __init__(self, config, tokenizer, compute_score, **kwargs):
        self.tokenizer, self.compute_score = tokenizer, compute_score
        self.experiment = config.trainer.experiment_name
        self.loop = asyncio.get_event_loop()

    async def run_single(self, data):
        item = data[0]
        response_ids = item.batch["responses"]
        length = int(item.batch["attention_mask"][-response_ids.shape[-1]:].sum())
        text = await self.loop.run_in_executor(
            None, lambda: self.tokenizer.decode(response_ids[:length], skip_special_tokens=True)
        )
        result = await self.compute_score(
            data_source=item.non_tensor_batch["data_source"],
            solution_str=text,
            ground_truth=item.non_tensor_batch["reward_model"]["ground_truth"],
            extra_info=item.non_tensor_batch["extra_info"],
        )
        return {"reward_score": result["score"], "reward_extra_info": {"experiment": self.experiment, "n": length}}


class Broken:
    def __init__(self, config, tokenizer, compute_score):
        raise RuntimeError("no judge configured")

    async def run_single(self, data):
        return 0.0
"""


@pytest.fixture(scope="module")
def judge():
    server, url = serve(DELAY, lambda body: FATES.get(body["solution_str"], "ok"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(URL_VAR, url)
        yield url
    server.shutdown()


@pytest.fixture
def manager_file(tmp_path):
    path = tmp_path / "my_manager.py"
    path.write_text(textwrap.dedent(MANAGER))
    return path


def _batch(tok, answers: list[str]) -> DataProto:
    """A prompt of 2 tokens and a right-padded answer + eos a row (verl's prompts / responses / attention_mask)."""
    width = max(map(len, answers)) + 1
    prompts = torch.full((len(answers), 2), tok.convert_tokens_to_ids("1"))
    ids = torch.full((len(answers), width), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, text in enumerate(answers):
        row = [tok.convert_tokens_to_ids(t) for t in text] + [tok.eos_token_id]
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    tensors = {"prompts": prompts, "responses": ids, "response_mask": mask}
    tensors["attention_mask"] = torch.cat([torch.ones_like(prompts), mask], dim=1)
    columns = {
        "data_source": ["colorl/reverse"] * len(answers),
        "reward_model": [{"ground_truth": "21"} for _ in answers],
        "extra_info": [{"index": i} for i in range(len(answers))],
    }
    return DataProto.from_dict(tensors, columns)


def _build(tok, *overrides: str):
    return make_reward_manager(load_config(["trainer.experiment_name=exp", *overrides]), tok, async_judge_score)


def _imported(manager_file, name="JudgedRewardManager") -> list[str]:
    source = ["reward.reward_manager.source=importlib", f"reward.reward_manager.module.path={manager_file}"]
    return [*source, f"reward.reward_manager.name={name}"]


def test_a_users_verl_manager_scores_each_row_at_once_and_its_failures_score_0(char_tokenizer, judge, manager_file):
    manager = _build(char_tokenizer, *_imported(manager_file), "+reward.timeout=0.8")
    assert isinstance(manager, ImportedRewardManager) and manager.name == "JudgedRewardManager"
    answers = ["21"] * 13 + ["12", "2", "1", "11"]  # 14 answered (13 right, 1 reversed), an error, a hang, nonsense
    started = time.perf_counter()
    handle = manager.submit(_batch(char_tokenizer, answers))  # returns at once: the judge works in the background
    assert time.perf_counter() - started < DELAY
    reward, extras = handle.result()
    assert extras["score"] == [1.0] * 13 + [default_compute_score("colorl/reverse", "12", "21")] + [0.0] * 3
    assert extras["experiment"][:14] == ["exp"] * 14 and extras["n"][0] == 3  # the config it was built with
    assert reward[0, 2].item() == 1.0 and reward.sum(-1).tolist() == pytest.approx(extras["score"])
    assert manager.last_error_reasons == {"raised": 1, "timeout": 1, "invalid": 1}
    started = time.perf_counter()
    manager(_batch(char_tokenizer, ["21"] * 16))
    assert time.perf_counter() - started < 4 * DELAY  # all 16 at once (verl gathers them), not 16 × 0.2 s


def test_the_example_manager_scores_as_the_naive_manager_does(char_tokenizer):
    example = Path(__file__).resolve().parents[2] / "examples" / "reward_manager.py"
    overrides = ["reward.reward_manager.source=importlib", f"reward.reward_manager.module.path={example}"]
    overrides += ["reward.reward_manager.name=LengthAwareRewardManager", "data.max_response_length=4"]
    imported = make_reward_manager(load_config(overrides), char_tokenizer, None)  # the built-in rule rewards
    batch = _batch(char_tokenizer, ["21", "12", "2", "21"])
    for key, column in (("responses", 2), ("response_mask", 2), ("attention_mask", 4)):  # the last one cut: no eos
        batch.batch[key][3, column] = char_tokenizer.pad_token_id if key == "responses" else 0
    reward, extras = imported(batch)
    naive_reward, naive = RewardManager(char_tokenizer)(batch)
    assert torch.equal(reward, naive_reward) and extras["score"] == naive["score"]
    assert extras["score"][0] == 1.0 and extras["score"][3] < 1.0  # "21" cut before its eos: not finished
    assert extras["response_fraction"] == [0.75, 0.75, 0.5, 0.5]


def test_the_core_batch_reaches_the_users_code_as_verls_dataproto(char_tokenizer, judge, manager_file):
    manager = _build(char_tokenizer, *_imported(manager_file))
    _, extras = manager(_batch(char_tokenizer, ["21", "21"]))  # the trainer's (core) DataProto
    assert extras["score"] == [1.0, 1.0] and manager.last_errors == 0


@pytest.mark.parametrize(
    "overrides, key, says",
    [
        (["reward.reward_manager.source=importlib"], "reward.reward_manager.module.path", "must name the Python file"),
        (["reward.reward_manager.source=importlib", "reward.reward_manager.module.path=/no/such.py"],
         "reward.reward_manager.module.path", "no such file"),
        ("Missing", "reward.reward_manager.name", "no class 'Missing' with an async run_single"),
        ("Broken", "reward.reward_manager.name",
         "building it with the config, tokenizer and compute_score raised RuntimeError: no judge configured"),
    ],
)  # fmt: skip
def test_a_manager_that_is_not_there_or_cannot_be_built_is_one_config_line(
    char_tokenizer, manager_file, overrides, key, says
):
    overrides = _imported(manager_file, overrides) if isinstance(overrides, str) else overrides
    with pytest.raises(ConfigError, match=key) as error:
        _build(char_tokenizer, *overrides)
    assert says in str(error.value) and "\n" not in str(error.value)
