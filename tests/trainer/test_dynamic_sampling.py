"""DAPO's dynamic sampling (``algorithm.filter_groups``, ``data.gen_batch_size``): the group filter, the collection
of generation batches, the step plan's routes, the dry run's arithmetic, and (Ray) two steps end to end and an exact
resume after a step that drew several generation batches."""

import numpy as np
import pytest
import torch

from algos import ADV_ESTIMATORS
from config import ConfigError
from config.schema import FilterGroupsConfig
from planner import load_config, load_with_plan
from planner.dataflow import DRIVER
from single_controller import DataProto
from trainer.running.dynamic_sampling import (
    DynamicSamplingError,
    collect,
    dynamic_sampling_lines,
    groups_with_signal,
    metric_values,
)
from trainer.state.fingerprint import check_resume, config_record

N = 2  # responses per prompt in these batches


def sampled(scores: list[list[float]], start: int = 0):
    """A generation batch's (batch, reward extras, metrics): one group of N rows per entry of ``scores``, each row's
    score as its summed token scores and as ``acc``; uids and ``index`` count from ``start``."""
    rows = [(start + g, s) for g, group in enumerate(scores) for s in group]
    token_scores = torch.zeros(len(rows), 3)
    token_scores[:, -1] = torch.tensor([s for _, s in rows])
    batch = DataProto.from_dict(
        {"token_level_scores": token_scores, "responses": torch.arange(len(rows) * 3).view(-1, 3) + 100 * start},
        {"uid": np.array([f"u{g}" for g, _ in rows], dtype=object), "index": np.array([g for g, _ in rows])},
        meta_info={"step_token": f"token{start}"},
    )
    return batch, {"score": [s for _, s in rows], "acc": [s for _, s in rows]}, {"health/frac_reward_zero_std": 0.5}


def source(*batches):
    """``collect``'s arguments: the first generation batch, the rest, and ``sample`` (which returns them)."""
    made = [sampled(scores, start=10 * i) for i, scores in enumerate(batches)]
    it = iter(made)
    return next(it)[0], (b for b, _, _ in it), {id(b): (b, e, m) for b, e, m in made}.__getitem__


def run(*batches, train_batch_size, **filter_groups):
    first, more, lookup = source(*batches)
    config = FilterGroupsConfig(**{"enable": True, "metric": "acc", **filter_groups})
    return collect(first, more, lambda batch: lookup(id(batch)), train_batch_size, N, config)


def test_a_group_is_kept_when_its_metric_differs_or_it_has_one_response():
    uids = ["a", "a", "b", "b", "c", "d", "d"]
    values = np.array([1.0, 1.0, 0.0, 1.0, 0.3, 0.5, 0.5])
    assert groups_with_signal(uids, values).tolist() == [False, False, True, True, True, False, False]


def test_metrics_come_from_the_scores_or_the_reward_functions_values():
    batch, extras, _ = sampled([[1.0, 0.0]])
    assert metric_values(batch, "seq_reward", extras).tolist() == [1.0, 0.0]
    assert metric_values(batch, "reward", {}).tolist() == [1.0, 0.0]
    assert metric_values(batch, "acc", {"score": [0.2, 0.3]}).tolist() == [0.2, 0.3]  # a plain number: acc = score
    with pytest.raises(ConfigError, match=r"algorithm\.filter_groups\.metric='correct': .*returns \['acc', 'score'\]"):
        metric_values(batch, "correct", extras)


def test_batches_are_drawn_until_enough_groups_have_signal_and_the_surplus_is_dropped(capsys):
    # batch 0: no group with signal; batch 1: two of three; batch 2: both -> 4 groups, 3 trained (1 surplus)
    batch, extras, metrics = run([[0, 0], [1, 1]], [[0, 1], [1, 1], [1, 0]], [[0, 1], [0.5, 1]], train_batch_size=3)
    assert len(batch) == 3 * N
    assert batch.non_tensor_batch["uid"].tolist() == ["u10", "u10", "u12", "u12", "u20", "u20"]
    assert torch.equal(
        batch.batch["responses"][:, 0], torch.tensor([1000, 1003, 1012, 1015, 2000, 2003])
    )  # rows move whole
    assert extras["acc"] == [0, 1, 1, 0, 0, 1]
    assert batch.meta_info == {}  # no generation batch's step token: the trainer gives the collection its own
    assert metrics["train/num_gen_batches"] == 3
    assert metrics["training/filter_groups/evicted_samples"] == 3
    assert metrics["training/filter_groups/discarded_surplus_samples"] == 1
    assert metrics["training/filter_groups/frac_reward_zero_std"] == 0.0
    assert metrics["health/frac_reward_zero_std"] == 0.5  # each batch's own metrics, averaged
    assert "2 of 3 prompt groups after 2 generation batch(es); drawing another" in capsys.readouterr().out


def test_the_cap_says_how_far_short_and_what_to_change():
    with pytest.raises(DynamicSamplingError) as raised:
        run([[0, 0], [0, 1]], [[1, 1], [1, 1]], [[0, 1], [0, 1]], train_batch_size=3, max_num_gen_batches=2)
    message = str(raised.value)
    assert "max_num_gen_batches=2: 2 generation batches (4 prompts) left 1 of the data.train_batch_size=3" in message
    assert "2 short (25% of groups had signal)" in message and "Raise max_num_gen_batches (0: no limit)" in message


def test_reward_values_follow_their_rows_across_batches():
    first, more, lookup = source([[0, 1]], [[1, 0]])

    def sample(batch):  # only the second batch's function returns a "format" value
        batch, extras, metrics = lookup(id(batch))
        second = batch.meta_info["step_token"] == "token10"
        return batch, ({**extras, "format": [0.25, 0.75]} if second else extras), metrics

    _, extras, _ = collect(first, more, sample, 2, N, FilterGroupsConfig(enable=True))
    assert extras["acc"] == [0, 1, 1, 0] and extras["format"] == [0.0, 0.0, 0.25, 0.75]


def test_without_filtering_every_group_of_smaller_generation_batches_is_kept():
    first, more, lookup = source([[0, 0]], [[1, 1]], [[2, 2]])
    batch, _, metrics = collect(first, more, lambda b: lookup(id(b)), 2, N, FilterGroupsConfig())
    assert batch.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u10", "u10"]
    assert metrics["train/num_gen_batches"] == 2 and "training/filter_groups/evicted_samples" not in metrics


DEMO = ["trainer.n_gpus_per_node=2", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]
DEMO += ["actor_rollout_ref.rollout.n=2"]


def test_the_filter_makes_the_generation_give_back_what_the_training_phases_read():
    cfg, plan = load_with_plan(
        [*DEMO, "algorithm.filter_groups.enable=true", "data.gen_batch_size=2", "reward.reward_model.enable=true"]
        + ["reward.reward_model.model_path=/models/rm"]
    )
    flow = plan.flows["step"]
    names = [phase.name for phase in flow.phases]
    assert names[:5] == ["prompts", "gen", "rm_score", "reward", "filter_groups"]
    selection = flow.phase("filter_groups")
    assert selection.on == DRIVER and selection.reads == selection.writes
    assert {"input_ids", "responses", "response_mask", "token_level_scores"} <= set(selection.reads)
    assert set(flow.route("gen").give) >= {"input_ids", "attention_mask", "responses", "response_mask"}
    after = names[names.index("filter_groups") + 1 :]
    for route in flow.routes:  # nothing after the filter is read from a worker's store of a generation batch
        if route.phase in after:
            assert not set(route.fetch) & set(selection.writes), route
    plain = load_with_plan(DEMO)[1]
    assert "filter_groups" not in [p.name for p in plain.flows["step"].phases] and not plain.dynamic_sampling
    assert (plan.gen_batch_size, plan.filter_metric, plan.dynamic_sampling) == (2, "reward", True)


def test_dynamic_sampling_config_mistakes_are_one_line():
    with pytest.raises(ConfigError, match=r"data\.gen_batch_size=3 × .*rollout\.n=1 = 3 sequences .* 2 workers"):
        load_config([*DEMO, "data.gen_batch_size=3", "actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=gae"])
    with pytest.raises(ConfigError, match=r"filter_groups\.metric=seq_final_reward: with algorithm\.use_kl_in"):
        load_config(
            [*DEMO, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_final_reward"]
            + ["algorithm.use_kl_in_reward=true"]
        )
    with pytest.raises(ConfigError, match=r"data\.gen_batch_size=0: must be null or a positive integer"):
        load_config([*DEMO, "data.gen_batch_size=0"])


def test_the_dry_run_explains_the_arithmetic():
    cfg, plan = load_with_plan(
        [*DEMO, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"]
        + ["algorithm.filter_groups.max_num_gen_batches=5", "data.gen_batch_size=8"]
    )
    text = "\n".join(dynamic_sampling_lines(cfg, plan))
    assert "data.gen_batch_size=8 prompts × 2 = 16 sequences (8 per worker)" in text
    assert "until data.train_batch_size=4 prompt groups are collected: 1 batch(es) a step at least" in text
    assert "max_num_gen_batches=5 a step (40 prompts): a step fails when fewer than 10% of its groups" in text
    assert dynamic_sampling_lines(*load_with_plan(DEMO)) == []


EXTRA = {"gdpo": ["algorithm.gdpo_reward_keys=[score]"]}


@pytest.mark.parametrize("estimator", sorted(ADV_ESTIMATORS))
@pytest.mark.parametrize(
    "variant",
    [
        [],
        ["actor_rollout_ref.rollout.calculate_log_probs=true"],  # the rollout's log-probs are the old ones
        ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.skip_on_policy_old_log_prob=false"],
        ["actor_rollout_ref.rollout.multi_turn.enable=true", "algorithm.use_kl_in_reward=true"],
    ],
)
def test_every_estimator_trains_on_the_filtered_rows_own_tensors(estimator, variant):
    cfg, plan = load_with_plan(
        [*DEMO, f"algorithm.adv_estimator={estimator}", "algorithm.filter_groups.enable=true", "data.gen_batch_size=2"]
        + EXTRA.get(estimator, [])
        + variant
    )
    flow = plan.flows["step"]
    names = [phase.name for phase in flow.phases]
    selection = flow.phase("filter_groups")
    written_before = {key for phase in flow.phases[: names.index("filter_groups")] for key in phase.writes}
    for later in flow.phases[names.index("filter_groups") + 1 :]:
        assert not (set(later.reads) & written_before) - set(selection.writes), later.name  # all selected rows
    for route in flow.routes:
        if names.index(route.phase) > names.index("filter_groups"):
            assert not set(route.fetch) & written_before, route  # none read from a generation batch's store


def test_a_run_stopped_by_the_cap_resumes_with_a_higher_cap_but_not_other_batches(tmp_path):
    saved = config_record(load_config([*DEMO, "algorithm.filter_groups.enable=true"]))
    raised = load_config(
        [*DEMO, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=20"]
    )
    assert check_resume(saved, raised, tmp_path) == []
    with pytest.raises(ConfigError, match=r"data\.gen_batch_size"):  # the data position counts its batches
        check_resume(
            saved, load_config([*DEMO, "algorithm.filter_groups.enable=true", "data.gen_batch_size=2"]), tmp_path
        )
