"""Two GRPO steps with multi_turn.enable=true on 2 CPU workers (real Ray, gloo, FSDP2): a tiny model taught to call
the calculator, verl's tool config shape and data layout, the tool metrics, the old log-probs from the agent loop
(rollout.calculate_log_probs), and validation's tool-call rate."""

import json
import math

import pytest

from data.builtin import write_parquet
from planner import load_config
from tests.workers.agent_helpers import save_tool_calling_model
from trainer.running import groups
from trainer.running.build import build_trainer

TOOL_CONFIG = """tools:
  - class_name: workers.tools.calculator.CalculatorTool
    config: {type: native}
  - class_name: verl.tools.gsm8k_tool.Gsm8kTool   # verl's class name: ColoRL's answer tool
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: calc_gsm8k_reward
        description: A tool for calculating the reward of gsm8k
        parameters: {type: object, properties: {answer: {type: string, description: the answer}}, required: [answer]}
"""


def rows(split: str, n: int) -> list[dict]:
    return [
        {
            "data_source": "colorl/arith",
            "agent_name": "tool_agent",
            "prompt": [{"role": "user", "content": "1+2?"}],  # what the model was taught
            "reward_model": {"style": "rule", "ground_truth": "3"},
            "extra_info": {
                "split": split,
                "index": i,
                "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "3"}}},
            },
        }
        for i in range(n)
    ]


def tool_config(tmp, model: str, extra: tuple[str, ...] = ()):
    """Two GRPO steps of 4 prompts × 2 with tools on 2 CPU workers, validation at the end; ``extra`` goes last."""
    write_parquet(rows("train", 8), tmp / "train.parquet")
    write_parquet(rows("val", 2), tmp / "val.parquet")
    (tmp / "tools.yaml").write_text(TOOL_CONFIG)
    return load_config(
        [
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={tmp / 'train.parquet'}",
            f"data.val_files={tmp / 'val.parquet'}",
            "data.train_batch_size=4",
            "data.max_prompt_length=32",
            "data.max_response_length=128",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp / 'tools.yaml'}",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
            "actor_rollout_ref.model.use_remove_padding=true",
            "actor_rollout_ref.rollout.calculate_log_probs=true",  # the old log-probs are the agent loop's
            "trainer.n_gpus_per_node=2",
            "trainer.device=cpu",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2",
            "trainer.logger=[file]",
            f"trainer.default_local_dir={tmp / 'out'}",
            "trainer.save_freq=-1",
            *extra,
        ]
    )


def fit(cfg) -> list[dict]:
    """Train ``cfg``; its metrics.jsonl records. Its workers are torn down after, as ``run_ppo`` does: an
    in-process worker (``trainer.use_ray=false``) leaves no process group behind for the next test."""
    trainer = build_trainer(cfg)
    try:
        trainer.init_workers()
        trainer.fit()
    finally:
        for group in trainer.worker_groups():
            groups.shutdown(group)
    path = cfg.trainer.default_local_dir
    return [json.loads(line) for line in open(f"{path}/metrics.jsonl").read().splitlines()]


@pytest.fixture(scope="module")
def run(ray_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multi_turn")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLORL_PRELOAD", "verl_compat.tools")  # as main.py sets it: the door serves verl's class name
        return fit(tool_config(tmp, save_tool_calling_model(tmp / "model")))


def test_two_grpo_steps_with_tools_log_the_tool_metrics(run):
    assert [r["step"] for r in run] == [0, 1, 2]
    for record in run[1:]:
        for key in (
            "num_turns/mean",
            "num_turns/max",
            "tool_call_counts/mean",
            "multi_turn/tool_errors/mean",
            "multi_turn/tool_response_tokens/mean",
            "multi_turn/turn_limit_ratio",
            "multi_turn/length_limit_ratio",
            "multi_turn/tokenization_mismatch_ratio",
            "timing_s/agent_loop/tool_calls",
            "actor/pg_loss",
            "critic/score/mean",
        ):
            assert key in record, key
        assert all(math.isfinite(v) for v in record.values()), record
        assert record["multi_turn/tokenization_mismatch_ratio"] == 0
        assert "timing_s/old_log_prob" not in record  # no forward: the rollout's log-probs are the old ones


def test_greedy_validation_calls_the_calculator_and_answers(run):
    for record in (run[0], run[2]):
        assert record["val-aux/colorl/arith/tool_call_counts/mean@1"] > 0
    assert run[0]["val-aux/colorl/arith/tool_call_counts/mean@1"] == 1  # the taught call, then "#### 3"
    assert run[0]["val-core/colorl/arith/reward/mean@1"] == 1
