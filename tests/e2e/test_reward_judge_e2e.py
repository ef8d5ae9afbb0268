"""The demo scored by a judge over HTTP on loopback (benchmarks.judge), through the rate_limited reward manager: a
response the judge fails on (an error status, nonsense, no answer) scores 0, counted by reason, and the run goes
on; a judge down for a whole step stops the run in one line, the last checkpoint intact and no step after it."""

import itertools
import json
import threading
from pathlib import Path

import pytest

from benchmarks.judge import URL_VAR, serve
from data.reward import RewardError
from planner import load_config
from trainer.running.build import build_trainer

DELAY, RESPONSES = 0.2, 128  # the demo's step: 16 prompts × 8 responses


def _fates():
    """Per request: the probe's (build_trainer's, before any model loads) and the first two steps' answers, with an
    error, nonsense and a hang among each step's; then down."""
    count, lock = itertools.count(), threading.Lock()

    def fate(body: dict) -> str:
        with lock:
            i = next(count) - 1  # -1: the probe
        if i >= 2 * RESPONSES:
            return "error"
        return {5: "error", 6: "nonsense", 7: "hang"}.get(i % RESPONSES, "ok")

    return fate


@pytest.mark.slow  # the demo's workers start, three steps
def test_demo_with_a_judge_scores_around_its_failures_and_stops_cleanly_when_it_is_down(ray_cluster, tmp_path):
    server, url = serve(DELAY, _fates())
    judge = Path(__file__).resolve().parents[2] / "benchmarks" / "judge.py"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(URL_VAR, url)
        cfg = load_config(
            [
                f"trainer.default_local_dir={tmp_path}",
                "trainer.logger=[file]",
                "trainer.total_training_steps=3",
                "trainer.save_freq=1",
                "trainer.test_freq=-1",
                "trainer.val_before_train=false",
                f"reward.custom_reward_function.path={judge}",
                "reward.custom_reward_function.name=async_judge_score",
                "reward.reward_manager.name=rate_limited",
                f"+reward.max_concurrent={RESPONSES}",
                "+reward.timeout=2.0",
            ]
        )
        trainer = build_trainer(cfg)
        trainer.init_workers()
        with pytest.raises(RewardError, match="raised ClientResponseError: 500.*all 128 responses"):
            trainer.fit()
    server.shutdown()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["reward/errors"] == 3
        assert (r["reward/errors/raised"], r["reward/errors/invalid"], r["reward/errors/timeout"]) == (1, 1, 1)
        assert r["timing_s/step"] < RESPONSES * DELAY / 4  # concurrent: far below the serial sum (25.6 s)
    saved = sorted(p.name for p in tmp_path.glob("global_step_*"))
    assert saved == ["global_step_1", "global_step_2"]  # step 3 saved nothing
