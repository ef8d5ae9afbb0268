"""Data for tool-calling rollouts: the --tools preprocessors (arith, GSM8K in verl's tool-agent layout,
reasoning-gym), tool schemas in the prompts of tool_agent rows, the reward manager on multi-turn responses, and
the driver's checks of the tools and the chat template."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from config import ConfigError
from data.dataset import RLHFDataset
from data.preprocess import arith, gsm8k
from data.reward import RewardManager
from planner import load_config
from single_controller import DataProto
from tests.data.gsm8k_fixture import printable_tokenizer, write_gsm8k

TOOLS_TEMPLATE = (
    "{% if tools %}<|tools|>{% for t in tools %}{{ t['function']['name'] }};{% endfor %}{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SCHEMA = {"type": "function", "function": {"name": "calculator", "description": "", "parameters": {}}}


def test_arith_tool_rows_are_tool_agent_rows_rendered_with_the_tools(tmp_path):
    arith.main(["--out_dir", str(tmp_path / "tools"), "--train_size", "6", "--test_size", "2", "--tools"])
    arith.main(["--out_dir", str(tmp_path / "plain"), "--train_size", "6", "--test_size", "2"])
    tool_rows, plain_rows = (pq.read_table(tmp_path / d / "train.parquet").to_pylist() for d in ("tools", "plain"))
    assert [r["reward_model"] for r in tool_rows] == [r["reward_model"] for r in plain_rows]  # the same problems
    assert all(
        r["agent_name"] == "tool_agent"
        and r["prompt"][-1] == plain["prompt"][-1]  # the same question
        and any("<tool_call>" in m["content"] for m in r["prompt"][:-1])
        for r, plain in zip(tool_rows, plain_rows)
    )
    tokenizer = printable_tokenizer(TOOLS_TEMPLATE)
    files = [str(tmp_path / "tools" / "train.parquet"), str(tmp_path / "plain" / "train.parquet")]
    dataset = RLHFDataset(files, tokenizer, max_prompt_length=1024, tool_schemas=[SCHEMA])
    texts = [tokenizer.decode(row["input_ids"]) for row in dataset.rows]
    assert dataset.num_tool_agent_rows == 6
    assert all(t.startswith("<|tools|>calculator;") for t in texts[:6]) and not any("<|tools|>" in t for t in texts[6:])
    batch = dataset.collate_fn(dataset.rows[5:7])
    assert list(batch["agent_name"]) == ["tool_agent", "single_turn_agent"]


def test_gsm8k_tools_has_verls_tool_agent_layout(tmp_path):
    written = gsm8k.preprocess(write_gsm8k(tmp_path / "in", "jsonl"), tmp_path / "out", tools=True)
    row = pq.read_table(written["train"]).to_pylist()[1]
    assert row["agent_name"] == "tool_agent" and row["data_source"] == "openai/gsm8k"
    assert row["prompt"][0] == {"role": "system", "content": gsm8k.TOOL_SYSTEM} and row["prompt"][1]["role"] == "user"
    assert row["extra_info"]["tools_kwargs"] == {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "2000"}}}
    dataset = RLHFDataset(str(written["train"]), printable_tokenizer(), max_prompt_length=4096)
    tools_kwargs = dataset.collate_fn(dataset.rows)["tools_kwargs"]
    assert tools_kwargs[1] == {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "2000"}}}


def test_reasoning_gym_rows_are_held_out_and_scored_by_its_checker(tmp_path, capsys):
    pytest.importorskip("reasoning_gym", reason="the reasoning_gym extra is not installed")
    from data.preprocess import reasoning_gym
    from data.tasks import default_compute_score

    reasoning_gym.main(
        [
            "--task",
            "chain_sum",
            "--out_dir",
            str(tmp_path),
            "--train_size",
            "40",
            "--test_size",
            "10",
            "--config",
            "max_terms=3",
        ]
    )
    train, test = (pq.read_table(tmp_path / f"{s}.parquet").to_pylist() for s in ("train", "test"))
    assert not {r["prompt"][1]["content"] for r in train} & {r["prompt"][1]["content"] for r in test}
    row = test[0]
    truth = row["reward_model"]["ground_truth"]
    assert row["data_source"] == "reasoning_gym/chain_sum" and "<answer>" in row["prompt"][0]["content"]
    score = lambda text: default_compute_score(row["data_source"], text, truth, row["extra_info"])  # noqa: E731
    assert (score(f"so <answer>{truth}</answer>"), score(truth), score("<answer>nope</answer>")) == (1.0, 0.0, 0.0)
    for argv, message in [
        (["--task", "nope"], "not a reasoning-gym task"),
        (["--task", "chain_sum", "--config", "bogus=1"], "refused it"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            reasoning_gym.main([*argv, "--out_dir", str(tmp_path / "x")])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_the_reward_manager_scores_the_whole_conversation_and_adds_tool_rewards():
    tokenizer = printable_tokenizer()
    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info):
        seen.append((solution_str, extra_info))
        return float("#### 3" in solution_str)

    text = "call<eos>tool says 3<eos>#### 3<eos>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    responses = torch.tensor([ids + [0] * 4])
    valid = torch.tensor([[1] * len(ids) + [0] * 4])
    model = valid.clone()
    model[0, 5:17] = 0  # the tool turn: attended, not trained
    batch = DataProto.from_dict(
        {"responses": responses, "response_mask": model, "attention_mask": torch.cat([torch.ones(1, 2), valid], -1)},
        {
            "data_source": np.array(["x"], dtype=object),
            "reward_model": np.array([{"ground_truth": "3"}]),
            "extra_info": np.array([{}]),
            "tool_rewards": np.array([-0.25], dtype=object),
            "__num_turns__": np.array([4], dtype=object),
            "reward_scores": np.array([{"calc": 1.0}]),
        },
    )
    scores, _ = RewardManager(tokenizer, compute_score)(batch)
    assert scores[0, len(ids) - 1] == 0.75 and scores.sum() == 0.75  # on the last token, the model's EOS
    solution, extra_info = seen[0]
    assert solution == "calltool says 3#### 3"
    assert extra_info["num_turns"] == 4 and extra_info["rollout_reward_scores"] == {"calc": 1.0}
    assert extra_info["stopped_by_eos"]


def test_the_driver_checks_tools_and_the_chat_template_before_any_model_loads(tmp_path):
    from trainer.running import build

    base = ["actor_rollout_ref.rollout.multi_turn.enable=true"]
    (tmp_path / "bad.yaml").write_text("tools:\n  - class_name: no.such.Tool\n")
    cfg = load_config([*base, f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path / 'bad.yaml'}"])
    with pytest.raises(ConfigError, match=r"multi_turn.tool_config_path=.*cannot import 'no.such'"):
        build._tool_schemas(cfg, printable_tokenizer())
    cfg = load_config([*base, "actor_rollout_ref.rollout.multi_turn.tool_config_path=conf/tools/calculator.yaml"])
    with pytest.raises(
        ConfigError, match="multi_turn.enable=True: .* cannot be built turn by turn: .* no chat template"
    ):
        build._tool_schemas(cfg, printable_tokenizer(chat_template=None))
    schemas = build._tool_schemas(cfg, printable_tokenizer(TOOLS_TEMPLATE))
    assert [s["function"]["name"] for s in schemas] == ["calculator"]
    assert json.loads(json.dumps(schemas)) == schemas
