"""trainer.v1's separate_async end to end on 2 CPU workers (real Ray, gloo, FSDP2): one trains, the other is the
rollout group; each batch trains one step after it was asked for (staleness 1, verl's metric), the rollout group
holds the trainer's weights after each sync, and a resume with a batch in flight is exact."""

import pytest
import torch

from planner import load_config
from tests.e2e.runs import run_keys
from tests.e2e.test_checkpoint import COMPARED
from tests.e2e.test_ppo_e2e import read_jsonl
from trainer.running.build import build_trainer

# the separate_async mode's minute-long runs; make test trains the README's separate_async line
pytestmark = pytest.mark.slow

STALENESS = [f"training/off_policy/trajectory_staleness/{s}" for s in ("mean", "max", "min")]


def tiny_async(tmp_path, steps: int) -> list[str]:
    """The async e2e tests' tiny GRPO run on CPU, deterministic, a checkpoint every step (no mode, no workers)."""
    return [
        f"builtin.cache_dir={tmp_path.parent / 'assets'}",
        "builtin.hidden_size=32",
        "builtin.num_val=4",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # two updates a step: the old log-probs' forward runs
        "algorithm.adv_estimator=grpo",
        *run_keys(tmp_path, steps),
    ]


def config(tmp_path, steps: int, *extra: str):
    return load_config(
        [
            *tiny_async(tmp_path, steps),
            "builtin.num_train=16",
            "data.max_response_length=5",
            "trainer.n_gpus_per_node=1",
            "trainer.v1.trainer_mode=separate_async",
            "trainer.v1.separate_async.parameter_sync_step=2",
            "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1",
            *extra,
        ]
    )


def _actor_weights(worker) -> dict:
    """A worker's full actor parameters (one rank: a plain module, or its shards are the whole tensors)."""
    params = worker.trained.module.named_parameters()
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for name, p in params}


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory):
    straight_dir, resumed_dir = tmp_path_factory.mktemp("straight"), tmp_path_factory.mktemp("resumed")
    straight = build_trainer(config(straight_dir, 4))
    straight.init_workers()
    straight.fit()
    trained = straight.fused_wg.execute_all_sync(
        "__ray_call__", lambda w: _actor_weights(w.worker_dict["actor_rollout"])
    )
    straight.ahead.sync.result()  # the last sync, which nothing waited for
    rollout = straight.ahead.rollout_group.execute_all_sync("__ray_call__", _actor_weights)
    for steps in (2, 4):  # two steps, stop with the third batch in flight; resume: take it, generate the fourth
        resumed = build_trainer(config(resumed_dir, steps))
        resumed.init_workers()
        resumed.fit()
    return straight, straight_dir, trained[0], rollout[0], resumed_dir


@pytest.mark.slow  # a minute of Ray runs: make test keeps under its 20 minutes
def test_each_batch_trains_one_step_after_it_was_asked_for_on_its_own_group(runs):
    straight, straight_dir, _, _, _ = runs
    records = [r for r in read_jsonl(straight_dir / "metrics.jsonl") if r["step"] > 0]
    assert [r["training/off_policy/trajectory_staleness/max"] for r in records] == [0, 1, 1, 1]
    assert all(r["training/off_policy/trajectory_spans/max"] == 1 for r in records)
    assert all(r["timing_s/update_weights"] > 0 for r in records)
    trainer_pids = {p["pid"] for p in straight.fused_wg.processes}
    rollout_pids = {p["pid"] for p in straight.ahead.rollout_group.processes}
    assert len(rollout_pids) == 1 and not trainer_pids & rollout_pids


def test_the_rollout_group_holds_the_trainers_weights_after_a_sync(runs):
    _, _, trained, rollout, _ = runs
    assert trained.keys() == rollout.keys()
    for name in trained:
        torch.testing.assert_close(rollout[name], trained[name], rtol=0, atol=0, msg=name)


def test_a_resume_with_a_batch_in_flight_is_exact(runs):
    _, straight_dir, _, _, resumed_dir = runs
    first = {r["step"]: r for r in read_jsonl(straight_dir / "metrics.jsonl")}
    second = {r["step"]: r for r in read_jsonl(resumed_dir / "metrics.jsonl")}
    assert sorted(second) == sorted(first) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        keys = COMPARED + STALENESS
        assert {k: second[step][k] for k in keys} == {k: first[step][k] for k in keys}, step


@pytest.mark.slow  # two more runs of the mode; make test keeps the mode's own e2e
def test_with_nothing_generated_ahead_a_step_is_the_sync_steps(ray_cluster, tmp_path):
    """num_warmup_batches=0: each batch is generated on the rollout group with the weights of the step before, as
    sync mode generates it on the trainer's. Greedy (no random draws to differ), bypass (π_old = the rollout's, as
    sync takes it): the two train the same samples into the same weights."""
    same = (
        "actor_rollout_ref.rollout.do_sample=false",
        "actor_rollout_ref.rollout.n=1",  # a prompt's greedy samples are one: no groups
        "actor_rollout_ref.rollout.calculate_log_probs=true",  # both take pi_old from the rollout
        "algorithm.adv_estimator=reinforce_plus_plus",
        "actor_rollout_ref.actor.optim.lr=1e-2",  # each step changes the next step's greedy responses
        "trainer.save_freq=-1",
    )
    modes = {
        "sync": ("trainer.v1.trainer_mode=sync",),
        "async": ("trainer.v1.separate_async.num_warmup_batches=0", "algorithm.rollout_correction.bypass_mode=true"),
    }
    records, weights = {}, {}
    for mode, keys in modes.items():
        trainer = build_trainer(config(tmp_path / mode, 3, *same, *keys))
        trainer.init_workers()
        trainer.fit()
        records[mode] = [
            {k: r[k] for k in COMPARED} for r in read_jsonl(tmp_path / mode / "metrics.jsonl") if r["step"] > 0
        ]
        actor = trainer.fused_wg.execute_all_sync(
            "__ray_call__", lambda w: _actor_weights(w.worker_dict["actor_rollout"])
        )
        weights[mode] = actor[0]
    assert len(records["async"]) == 3
    for synced, ahead in zip(records["sync"], records["async"], strict=True):
        assert ahead == pytest.approx(synced, rel=1e-5, abs=1e-7)
    assert weights["sync"].keys() == weights["async"].keys()
    for name in weights["sync"]:
        torch.testing.assert_close(weights["async"][name], weights["sync"][name], msg=name)
