"""The demo scored by a user's function that never answers on 2 % of its calls (reward.timeout, data.reward_pool):
every run finishes, reward/errors/timeout counts every hang (in training and in validation), and no step's reward
phase takes longer than its hangs' timeouts allow."""

import json

import pytest

from planner import load_config
from trainer.running.build import build_trainer

TIMEOUT, STEPS = 1.0, 2

SOURCE = """
import random, time
from data.rewards.arith import compute_score as arith

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str and random.random() < 0.02:  # never the probe's empty response
        with open({log!r}, "a") as log:
            log.write("hang\\n")
        time.sleep(3600)
    return arith(data_source, solution_str, ground_truth, extra_info)
"""


def hanging_run(tmp_path, *more: str) -> tuple[list[dict], int]:
    """A demo run of ``STEPS`` steps scored by the hanging function: its metrics records and the hangs it met."""
    reward = tmp_path / "hang_reward.py"
    reward.write_text(SOURCE.format(log=str(tmp_path / "hangs.log")))
    cfg = load_config(
        [
            f"trainer.default_local_dir={tmp_path / 'run'}",
            "trainer.logger=[file]",
            f"trainer.total_training_steps={STEPS}",
            "trainer.save_freq=-1",
            f"reward.custom_reward_function.path={reward}",
            f"reward.timeout={TIMEOUT}",
            *more,
        ]
    )
    trainer = build_trainer(cfg)
    trainer.init_workers()
    trainer.fit()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    hangs = (tmp_path / "hangs.log").read_text().count("hang") if (tmp_path / "hangs.log").exists() else 0
    return [json.loads(line) for line in lines], hangs


def check_bounded(records: list[dict], hangs: int) -> None:
    steps = [r for r in records if "timing_s/reward" in r]
    assert len(steps) == STEPS
    counted = sum(r.get("reward/errors/timeout", 0) + r.get("val-aux/reward/errors/timeout", 0) for r in records)
    assert hangs > 0 and counted == hangs  # every hang scored 0 as a timeout, and nothing else did
    for r in steps:  # the hangs of a step cost at most their timeouts, one after another; the rest is the rule's
        assert r["timing_s/reward"] < r.get("reward/errors/timeout", 0) * (TIMEOUT + 0.5) + 10


@pytest.mark.usefixtures("ray_cluster")
def test_naive_and_validation_survive_hangs(tmp_path):
    records, hangs = hanging_run(tmp_path, "trainer.val_before_train=true", "trainer.test_freq=1")
    assert any("val-aux/reward/errors/timeout" in r or "val-core/arith/reward/mean@1" in r for r in records)
    check_bounded(records, hangs)


@pytest.mark.slow  # the same pool as naive's; make test keeps naive + validation
@pytest.mark.usefixtures("ray_cluster")
def test_dapo_survives_hangs(tmp_path):
    check_bounded(*hanging_run(tmp_path, "reward.reward_manager.name=dapo"))
