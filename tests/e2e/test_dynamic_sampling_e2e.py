"""Dynamic sampling end to end on 2 CPU workers (real Ray, gloo, FSDP2): steps that draw several generation batches,
drop the groups without signal and train on the kept rows' own tensors; a resume after such a step is exact."""

import pytest

from planner import load_config
from tests.e2e.dataflow_reads import assert_declared, record_reads, recorded_reads
from tests.e2e.runs import run_keys
from tests.e2e.test_checkpoint import COMPARED
from tests.e2e.test_ppo_e2e import read_jsonl
from trainer.running.build import build_trainer

# even-indexed prompts score the same whatever the response (no signal); odd ones by the response's characters
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    if extra_info["index"] % 2 == 0:
        return 0.5
    return (sum(map(ord, solution_str)) % 997) / 997
"""
DS_METRICS = ["train/num_gen_batches", "training/filter_groups/evicted_samples"]


def config(tmp_path, steps: int):
    reward = tmp_path.parent / "ds_reward.py"
    reward.write_text(REWARD)
    return load_config(
        [
            f"builtin.cache_dir={tmp_path.parent / 'assets'}",
            "builtin.hidden_size=32",
            "builtin.num_train=16",
            "builtin.num_val=4",
            "builtin.sft_warmup_steps=0",  # an untrained model: a group's responses differ
            "data.train_batch_size=4",
            "data.gen_batch_size=2",  # two prompts a generation batch: at least two batches a step
            "data.max_response_length=5",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.skip_on_policy_old_log_prob=false",  # old log-probs kept on the workers
            "actor_rollout_ref.actor.use_kl_loss=true",  # and the reference's
            "algorithm.adv_estimator=grpo",
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.metric=acc",  # a plain number's acc is its score (verl's dapo manager)
            f"reward.custom_reward_function.path={reward}",
            "trainer.n_gpus_per_node=2",
            *run_keys(tmp_path, steps),
        ]
    )


def trained_rows(trainer) -> list[list[int]]:
    """Wrap the trainer's worker calls to note, at each update, the prompts (dataset index) of the rows it sends."""
    seen, call = [], trainer.step._call

    def recording(phase, batch, *args, **kwargs):
        if phase == "update_actor":
            seen.append([info["index"] for info in batch.non_tensor_batch["extra_info"]])
        return call(phase, batch, *args, **kwargs)

    trainer.step._call = recording
    return seen


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory):
    straight_dir, resumed_dir = tmp_path_factory.mktemp("straight"), tmp_path_factory.mktemp("resumed")
    straight = build_trainer(config(straight_dir, 2))
    straight.init_workers()
    straight.fused_wg.execute_all_sync("__ray_call__", record_reads)
    rows = trained_rows(straight)
    straight.fit()
    reads = straight.fused_wg.execute_all_sync("__ray_call__", recorded_reads)
    for steps in (1, 2):  # one step, stop; resume and take the second
        resumed = build_trainer(config(resumed_dir, steps))
        resumed.init_workers()
        resumed.fit()
    return straight, straight_dir, rows, reads, resumed, resumed_dir


@pytest.mark.slow  # the module's runs: ~65 s (the filter and its batches: tests/trainer/test_dynamic_sampling.py)
def test_steps_draw_generation_batches_until_the_batch_has_signal(runs):
    _, straight_dir, rows, _, _, _ = runs
    records = read_jsonl(straight_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["train/num_gen_batches"] >= 2  # 2-prompt batches for a 4-prompt step, half of them dropped
        assert record["training/filter_groups/evicted_samples"] >= 1
        assert record["training/filter_groups/frac_reward_zero_std"] == 0.0
        assert record["actor/ppo_kl"] == 0.0  # the update's log-probs are the old ones: the same rows, unchanged
        assert record["actor/kl_loss"] == pytest.approx(0.0, abs=1e-3)  # and the reference's, of those rows
    for indices in rows:  # each update: 4 prompt groups × 2, every one of them a prompt with signal
        assert len(indices) == 8 and all(i % 2 == 1 for i in indices)
        assert indices[::2] == indices[1::2]  # whole groups, in order
    # the run's ledger (trainer.state.ledger): each step's trained prompts are those its update saw; every prompt
    # drawn ends once, the ones without signal (even) filtered
    ledger = read_jsonl(straight_dir / "ledger.jsonl")
    assert [line["trained"] for line in ledger] == [indices[::2] for indices in rows]
    drawn = [i for line in ledger for i in line["drawn"]]
    ended = [i for line in ledger for i in line["trained"] + line["filtered"]]
    assert len(set(drawn)) == len(drawn) and sorted(ended) == sorted(drawn)
    assert {i for i in drawn if i % 2 == 0} <= {i for line in ledger for i in line["filtered"]}


@pytest.mark.slow  # the module's runs: ~65 s (the filter and its batches: tests/trainer/test_dynamic_sampling.py)
def test_the_training_phases_read_exactly_their_declared_keys(runs):
    straight, _, _, reads, _, _ = runs
    assert_declared(straight, reads, {"gen", "old_log_prob", "ref", "update_actor"})


@pytest.mark.slow  # the module's runs: ~65 s (the filter and its batches: tests/trainer/test_dynamic_sampling.py)
def test_a_resume_after_a_step_of_several_generation_batches_is_exact(runs):
    straight, straight_dir, _, _, resumed, resumed_dir = runs
    first = {r["step"]: r for r in read_jsonl(straight_dir / "metrics.jsonl")}
    second = {r["step"]: r for r in read_jsonl(resumed_dir / "metrics.jsonl")}
    assert sorted(second) == [1, 2]
    for step in (1, 2):
        assert {k: second[step][k] for k in COMPARED + DS_METRICS} == {k: first[step][k] for k in COMPARED + DS_METRICS}
    assert resumed.data.state()["batch_in_epoch"] == straight.data.state()["batch_in_epoch"]
    assert straight.data.state()["batch_in_epoch"] >= 4  # two steps of two generation batches or more
