"""A reward function set on a built trainer (``trainer.reward_fn = fn``, as verl's ``RayPPOTrainer`` takes one)
scores the steps ``fit`` runs: the step object holds the function the trainer was given last."""

import json

import torch

from planner import load_config
from trainer.running import groups
from trainer.running.build import build_trainer

SCORE = 0.25


def constant_reward(batch):
    """Every response scores ``SCORE``, on its first response token; the tally of calls in ``calls``."""
    constant_reward.calls += 1
    scores = torch.zeros(batch.batch["responses"].shape, dtype=torch.float32)
    scores[:, 0] = SCORE
    return scores, {}


def test_a_reward_fn_set_on_the_trainer_scores_every_step(tmp_path):
    cfg = load_config(
        [
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[file]",
            "trainer.total_training_steps=2",
            "trainer.save_freq=-1",
            "trainer.use_ray=false",
            "trainer.n_gpus_per_node=1",
        ]
    )
    trainer = build_trainer(cfg)
    constant_reward.calls = 0
    trainer.reward_fn = constant_reward
    assert trainer.reward_fn is constant_reward and trainer.step.reward_fn is constant_reward
    try:
        trainer.init_workers()
        trainer.fit()
    finally:
        for group in trainer.worker_groups():
            groups.shutdown(group)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "critic/score/mean" in r]
    assert len(steps) == 2 and constant_reward.calls >= 2
    for record in steps:  # the demo's own arithmetic reward would give scores of 0 and 1, not a constant
        assert (
            record["critic/score/mean"] == SCORE and record["critic/score/max"] == record["critic/score/min"] == SCORE
        )
