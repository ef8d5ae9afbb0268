"""trainer.v1's modes: read with verl's defaults; each bad value one line before anything starts; the replay buffer's
off-policy bounds and verl's staleness metrics (which keys warn: tests/verl_compat/cli/test_verl_warnings.py)."""

import numpy as np
import pytest

from config import ConfigError
from planner import load_with_plan
from trainer.asynchronous.replay_buffer import Generation, ReplayBuffer, eviction_metrics, staleness_metrics

ONE_EACH = ["trainer.device=cpu", "trainer.n_gpus_per_node=1", "data.train_batch_size=4"]
ONE_EACH += ["actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=2"]
SEPARATE = ["trainer.v1.trainer_mode=separate_async", "trainer.v1.separate_async.parameter_sync_step=1"]
SEPARATE += ["actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1"]


def _plan(*overrides):
    return load_with_plan([*ONE_EACH, *overrides])


def test_verls_defaults_are_sync_and_a_separate_group_is_read():
    _, plan = _plan()
    assert (plan.mode.mode, plan.mode.lookahead, plan.mode.rollout_workers) == ("sync", 0, 0)
    _, plan = _plan(*SEPARATE)
    mode = plan.mode
    assert (mode.mode, mode.lookahead, mode.rollout_workers, mode.max_off_policy_threshold) == (
        "separate_async",
        1,
        1,
        8,
    )


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["trainer.v1.trainer_mode=fully_async"], "trainer.v1.trainer_mode='fully_async'"),
        (["trainer.v1.sampler.max_off_policy_strategy=keep"], "max_off_policy_strategy='keep'"),
        (["trainer.v1.separate_async.parameter_sync_step=0"], "parameter_sync_step=0"),
        (["trainer.v1.separate_async.parameter_sync_step=-2"], "parameter_sync_step=-2"),
        (["trainer.v1.sampler.max_off_policy_threshold=0"], "max_off_policy_threshold=0"),
        ([*SEPARATE, "actor_rollout_ref.rollout.nnodes=0"], "actor_rollout_ref.rollout.nnodes=0"),
        ([*SEPARATE, "ray_kwargs.ray_init.num_cpus=1"], "ray_kwargs.ray_init.num_cpus=1"),
        ([*SEPARATE, "actor_rollout_ref.rollout.n_gpus_per_node=3"], "rollout group's 3 workers"),
        ([*SEPARATE, "trainer.v1.separate_async.parameter_sync_step=2"], "parameter_sync_step=2"),
        (
            ["trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=8"],
            "num_warmup_batches=8",
        ),
        ([*SEPARATE, "algorithm.filter_groups.enable=true"], "algorithm.filter_groups.enable"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(overrides, names):
    with pytest.raises(ConfigError) as error:
        _plan(*overrides)
    message = str(error.value)
    assert names in message and "\n" not in message


def test_a_parameter_sync_step_refusal_names_the_values_that_hold():
    """parameter_sync_step × ppo_mini_batch_size must be the batch (verl's rule): the refusal says the product, and
    each value it proposes loads (the batch of 4 prompts: sync 2 × mini 4 = 8 proposes sync 1, mini 2, batch 8)."""
    with pytest.raises(ConfigError) as error:
        _plan(*SEPARATE, "trainer.v1.separate_async.parameter_sync_step=2")
    message = str(error.value)
    assert "parameter_sync_step=2 × actor_rollout_ref.actor.ppo_mini_batch_size=4 = 8 prompts" in message
    fixes = message.partition("; set ")[2].split(" or ")
    assert len(fixes) == 3
    for fix in fixes:
        _plan(*SEPARATE, "trainer.v1.separate_async.parameter_sync_step=2", fix)


def test_async_old_log_probs_are_the_rollouts_only_in_bypass_mode():
    """The rollout of an async mode samples with older weights: its log-probs stand for the old ones (skipping the
    forward) only in bypass mode, as algorithm.rollout_correction says."""
    two = ["actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.v1.separate_async.parameter_sync_step=2"]
    logprobs = ["actor_rollout_ref.rollout.calculate_log_probs=true", *two]  # two updates: not on-policy
    _, sync = _plan(*logprobs)
    _, separate = _plan(*SEPARATE, *logprobs)
    bypass_mode = [
        "algorithm.rollout_correction.bypass_mode=true",
        "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode",
    ]
    _, bypass = _plan(*SEPARATE, *logprobs, *bypass_mode)  # verl's loader derives the loss: test_verl_schema.py
    assert sync.old_log_prob_from_rollout and not sync.recompute_old_log_prob
    assert not separate.old_log_prob_from_rollout and separate.recompute_old_log_prob
    assert bypass.old_log_prob_from_rollout and not bypass.recompute_old_log_prob


def _mode(lookahead, threshold, strategy):
    _, plan = _plan(
        "trainer.v1.trainer_mode=colocate_async",
        f"trainer.v1.colocate_async.num_warmup_batches={lookahead}",
        f"trainer.v1.sampler.max_off_policy_threshold={threshold}",
        f"trainer.v1.sampler.max_off_policy_strategy={strategy}",
    )
    return plan.mode


def test_the_buffer_keeps_lookahead_batches_ahead_in_order():
    buffer = ReplayBuffer(_mode(2, 8, "drop"))
    assert buffer.wanted() == 3  # the one to train next and 2 ahead
    for asked in range(3):
        buffer.add(Generation(asked_at=1, version=0, result=asked))
    assert buffer.wanted() == 0
    taken, evicted = buffer.take(step=1)
    assert (taken.result, evicted, buffer.wanted()) == (0, [], 1)


def test_drop_evicts_batches_past_the_threshold_and_wait_never_asks_that_far():
    buffer = ReplayBuffer(_mode(1, 2, "drop"))
    buffer.add(Generation(asked_at=1, version=0, result="old"))
    buffer.add(Generation(asked_at=3, version=2, result="fresh"))
    taken, evicted = buffer.take(step=3)  # span of the first: 3 - 1 + 1 = 3 > 2
    assert taken.result == "fresh" and [g.result for g in evicted] == ["old"]
    assert eviction_metrics(3, evicted, prompts_each=4) == {
        "training/off_policy/evicted_samples": 4.0,
        "training/off_policy/evicted_samples_staleness/mean": 3.0,
        "training/off_policy/evicted_samples_staleness/max": 3.0,
        "training/off_policy/evicted_samples_staleness/min": 3.0,
    }
    assert ReplayBuffer(_mode(1, 2, "drop")).depth == 1
    waiting = ReplayBuffer(_mode(5, 3, "wait"))
    assert waiting.depth == 2  # a batch trains at most 2 steps after it was asked for: span 3, never over
    waiting.add(Generation(asked_at=1, version=0, result="old"))
    assert waiting.take(step=9)[0].result == "old"  # wait never drops


def test_staleness_metrics_are_verls_names_in_versions():
    metrics = staleness_metrics(step=5, versions=np.array([4, 4, 3, 2]))
    assert metrics["training/off_policy/trajectory_staleness/mean"] == pytest.approx(0.75)
    assert metrics["training/off_policy/trajectory_staleness/max"] == 2
    assert metrics["training/off_policy/trajectory_staleness/min"] == 0  # the previous step's weights: on-policy
    assert metrics["training/off_policy/trajectory_spans/max"] == 1
    assert metrics["training/off_policy/trajectory_staleness_worst/max"] == 2


def test_colocate_async_has_partial_rollouts_where_the_rollout_can_stop_and_go_on():
    """The hf single-turn rollout: partial rollouts, each worker decoding every batch in flight at once; a vLLM
    engine or an agent loop: whole batches, with a warning."""
    colocate = ["trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=2"]
    _, sync = _plan()
    _, partial = _plan(*colocate)
    assert partial.mode.partial and partial.gen_rows == 3 * sync.gen_rows
    with pytest.warns(UserWarning, match="rollout.name=vllm: no partial rollouts"):
        _, whole = _plan(*colocate, "actor_rollout_ref.rollout.name=vllm")
    assert not whole.mode.partial and whole.gen_rows == sync.gen_rows
