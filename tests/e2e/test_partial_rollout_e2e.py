"""trainer.v1's colocate_async end to end on one group of 2 CPU workers (real Ray, gloo, FSDP2): partial rollouts
(trainer.asynchronous.partial). A step trains the first groups to end; the rows still decoding go on at the next step
under the new weights (verl's spans > 1), every step on the same number of samples; a resume with rows in flight is
exact; ``wait`` and ``drop`` keep every span within the threshold."""

import pytest

from planner import load_config
from tests.e2e.test_async_e2e import STALENESS, tiny_async
from tests.e2e.test_checkpoint import COMPARED
from tests.e2e.test_ppo_e2e import read_jsonl
from trainer.running.build import build_trainer

# colocate_async's minute-long runs; its pieces are tests/workers/test_partial_rollout.py
pytestmark = pytest.mark.slow

OFF_POLICY = "training/off_policy"
SPANS = [f"{OFF_POLICY}/trajectory_spans/{s}" for s in ("mean", "max", "min")]


def config(tmp_path, steps: int, *extra: str):
    return load_config(
        [
            *tiny_async(tmp_path, steps),
            "builtin.num_train=32",
            "data.max_response_length=48",  # the tiny model's responses end anywhere in it: pieces stop mid-way
            "trainer.n_gpus_per_node=2",
            "trainer.v1.trainer_mode=colocate_async",
            *extra,
        ]
    )


def _run(tmp_path, steps: int, *extra: str) -> dict[int, dict]:
    trainer = build_trainer(config(tmp_path, steps, *extra))
    trainer.init_workers()
    trainer.fit()
    return {r["step"]: r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["step"] > 0}


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory):
    straight_dir, resumed_dir = tmp_path_factory.mktemp("straight"), tmp_path_factory.mktemp("resumed")
    straight = _run(straight_dir, 5)
    for steps in (3, 5):  # stop with rows in flight; resume: they go on
        resumed = _run(resumed_dir, steps)
    return straight, resumed, straight_dir


@pytest.mark.slow  # a minute of Ray runs: make test keeps under its 20 minutes
def test_unended_rows_go_on_at_the_next_step_under_new_weights(runs):
    straight, _, _ = runs
    assert sorted(straight) == [1, 2, 3, 4, 5]
    assert max(r[f"{OFF_POLICY}/trajectory_spans/max"] for r in straight.values()) > 1  # continued rows
    for r in straight.values():
        assert r[f"{OFF_POLICY}/trajectory_staleness_worst/max"] >= r[f"{OFF_POLICY}/trajectory_staleness/max"]
        assert r["response_length/max"] <= 48  # a row's pieces share one budget


def test_a_resume_with_rows_in_flight_is_exact(runs):
    straight, resumed, _ = runs
    assert sorted(resumed) == sorted(straight)
    keys = COMPARED + STALENESS + SPANS
    for step in straight:
        assert {k: resumed[step][k] for k in keys} == {k: straight[step][k] for k in keys}, step


@pytest.mark.slow  # a run per strategy; make test keeps the partial rollouts' own e2e
@pytest.mark.parametrize("strategy", ["wait", "drop"])
def test_the_threshold_bounds_every_span(ray_cluster, tmp_path, strategy):
    """wait: a piece waits for the rows that would pass it; drop: their groups are evicted (verl's metrics)."""
    bounded = (
        "trainer.v1.sampler.max_off_policy_threshold=2",
        f"trainer.v1.sampler.max_off_policy_strategy={strategy}",
    )
    records = _run(tmp_path, 5, *bounded, "trainer.save_freq=-1")
    assert all(r[f"{OFF_POLICY}/trajectory_spans/max"] <= 2 for r in records.values())
    evicted = sum(r.get(f"{OFF_POLICY}/evicted_samples", 0) for r in records.values())
    assert (evicted > 0) == (strategy == "drop")
