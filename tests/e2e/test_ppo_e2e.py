"""End to end on CPU: colocated FSDP2 actor/ref/critic over 2 real worker processes, real Ray, gloo, wandb offline."""

import json
import math

import pytest
import torch

from planner import load_config
from single_controller import DataProto
from tests.e2e.dataflow_reads import assert_declared, record_reads, recorded_reads
from tests.wandb_offline import history, run_file, wandb_records
from trainer.running.build import build_trainer
from workers.parallel.fsdp import fsdp_modules
from workers.runtime import malloc

REQUIRED = [
    "critic/score/mean",
    "critic/rewards/mean",
    "critic/advantages/mean",
    "critic/returns/mean",
    "response_length/mean",
    "prompt_length/mean",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/kl_loss",
    "actor/grad_norm",
    "actor/lr",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/adv",
    "timing_s/update_actor",
    "timing_s/step",
    "perf/throughput",
    "perf/time_per_step",
    "perf/mfu/actor",
    "perf/cpu_memory_used_gb",
]
CRITIC_REQUIRED = [
    "critic/values/mean",
    "critic/vf_explained_var",
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/grad_norm",
    "timing_s/values",
    "timing_s/update_critic",
    "perf/mfu/critic",
]
VAL_KEY = "val-core/colorl/copy/reward/mean@1"


def tiny_config(
    tmp_path,
    estimator: str,
    logger: str = "[file]",
    device: str = "cpu",
    n_workers: int = 2,
    recompute_old_log_prob: bool = True,
    extra: tuple[str, ...] = (),
):
    """Two steps of 4 prompts × 2; by default the old log-probs get their own forward (the general path);
    ``extra`` overrides go last."""
    return load_config(
        [
            f"actor_rollout_ref.actor.skip_on_policy_old_log_prob={str(not recompute_old_log_prob).lower()}",
            f"builtin.cache_dir={tmp_path.parent / 'assets'}",
            "builtin.hidden_size=32",
            "builtin.num_train=64",
            "builtin.num_val=6",
            "builtin.sft_warmup_steps=2",
            f"data.train_batch_size={max(4, n_workers)}",
            "data.max_response_length=6",
            "actor_rollout_ref.rollout.n=2",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={max(4, n_workers)}",
            "actor_rollout_ref.actor.use_kl_loss=true",
            f"algorithm.adv_estimator={estimator}",
            f"trainer.n_gpus_per_node={n_workers}",
            f"trainer.device={device}",
            "trainer.total_training_steps=2",
            "trainer.test_freq=1",
            f"trainer.default_local_dir={tmp_path}",
            f"trainer.logger={logger}",
            *extra,
        ]
    )


def local_param_sums(worker) -> dict[str, list[float]]:
    """Per-parameter sums of this rank's FSDP shards, for the actor and the reference model."""

    def sums(module):
        for sharded in fsdp_modules(module):
            sharded.reshard()  # the root stays gathered after forward; compare shards with shards
        return [p.to_local().double().sum().item() for p in module.parameters()]

    roles = worker.worker_dict
    return {"actor": sums(roles["actor_rollout"].actor.module), "ref": sums(roles["ref"].ref_policy.module)}


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def gae_run(ray_cluster, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("gae")
    dumps = (  # verl's generation dumps and validation samples in wandb, on top of the run report
        f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",
        f"trainer.validation_data_dir={tmp_path / 'validations'}",
        "trainer.log_val_generations=2",
    )
    trainer = build_trainer(tiny_config(tmp_path, "gae", logger="[file,wandb]", extra=dumps))
    trainer.init_workers()
    trainer.fused_wg.execute_all_sync("__ray_call__", record_reads)
    before = trainer.fused_wg.execute_all_sync("__ray_call__", local_param_sums)
    trainer.fit()
    after = trainer.fused_wg.execute_all_sync("__ray_call__", local_param_sums)
    mimalloc = trainer.fused_wg.execute_all_sync("__ray_call__", lambda worker: malloc.uses_mimalloc())
    return trainer, tmp_path, before, after, trainer.fused_wg.execute_all_sync("__ray_call__", recorded_reads), mimalloc


def test_gae_metrics_are_logged_finite_and_complete(gae_run):
    trainer, tmp_path, *_ = gae_run
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert VAL_KEY in records[0]
    for record in records[1:]:
        missing = [k for k in REQUIRED + CRITIC_REQUIRED + [VAL_KEY] if k not in record]
        assert not missing, f"step {record['step']} lacks {missing}"
        assert all(math.isfinite(v) for k, v in record.items()), record
    assert (tmp_path / "reward_curve.png").stat().st_size > 0


def test_generation_dumps_samples_and_the_report(gae_run):
    trainer, tmp_path, *_ = gae_run
    rollouts = {p.name: read_jsonl(p) for p in (tmp_path / "rollouts").iterdir()}
    assert sorted(rollouts) == ["1.jsonl", "2.jsonl"] and all(len(rows) == 8 for rows in rollouts.values())
    assert all(list(row)[:5] == ["input", "output", "gts", "score", "step"] for row in rollouts["2.jsonl"])
    validations = sorted(p.name for p in (tmp_path / "validations").iterdir())
    assert (
        validations == ["0.jsonl", "1.jsonl", "2.jsonl"] and len(read_jsonl(tmp_path / "validations" / "2.jsonl")) == 6
    )
    samples = read_jsonl(tmp_path / "samples" / "train" / "2.jsonl")
    assert samples and all(len(s["tokens"]) == len(s["log_probs"]) == s["response_length"] for s in samples)
    assert '"2":[' in (tmp_path / "report.html").read_text()  # step 2's samples are in the report
    rows = [
        row
        for row in history(wandb_records(run_file(tmp_path, trainer.logger.wandb_run_id)))
        if "val/generations.nrows" in row
    ]
    assert [row["val/generations.nrows"] for row in rows] == [1, 2, 3]  # a row per validation (verl's table)


def test_cpu_workers_allocate_with_mimalloc(gae_run):
    """The trainer preloads mimalloc into its CPU workers (glibc's malloc fragments under a training step)."""
    assert malloc.mimalloc_library() is not None, "cmeel-mimalloc is a dependency on Linux"
    assert gae_run[5] and all(gae_run[5])


def test_actor_and_ref_agree_at_the_first_step(gae_run):
    first = read_jsonl(gae_run[1] / "metrics.jsonl")[1]
    assert abs(first["actor/ref_kl"]) < 1e-5
    assert abs(first["actor/kl_loss"]) < 1e-5


def test_update_changes_actor_but_not_ref(gae_run):
    _, _, before, after, *_ = gae_run
    for rank_before, rank_after in zip(before, after):
        assert rank_before["ref"] == rank_after["ref"]
        assert rank_before["actor"] != rank_after["actor"]


def test_wandb_offline_run_holds_the_metrics(gae_run):
    trainer, tmp_path, *_ = gae_run
    rows = history(wandb_records(run_file(tmp_path, trainer.logger.wandb_run_id)))
    assert [row["_step"] for row in rows] == [0, 1, 2]
    assert rows[-1]["actor/pg_loss"] == pytest.approx(read_jsonl(tmp_path / "metrics.jsonl")[-1]["actor/pg_loss"])


def test_each_worker_phase_reads_exactly_what_the_plan_declares(gae_run):
    """The worker phases compute with every key their route brings them, and with nothing else."""
    trainer, reads = gae_run[0], gae_run[4]
    assert_declared(trainer, reads, {"gen", "old_log_prob", "ref", "values", "update_critic", "update_actor"})


def test_critic_loss_falls_on_a_fixed_batch(gae_run):
    trainer = gae_run[0]
    torch.manual_seed(0)
    b, p, r = 8, 8, 6
    input_ids = torch.randint(4, 20, (b, p + r))
    batch = DataProto.from_dict(
        {
            "input_ids": input_ids,
            "responses": input_ids[:, p:],
            "attention_mask": torch.ones(b, p + r, dtype=torch.long),
            "position_ids": torch.arange(p + r).expand(b, -1).clone(),
            "response_mask": torch.ones(b, r),
            "values": torch.zeros(b, r),
            "returns": torch.rand(b, r),
        }
    )
    losses = [sum(trainer.critic_wg.update_critic(batch).meta_info["metrics"]["critic/vf_loss"]) for _ in range(6)]
    assert losses[-1] < losses[0]


def test_grpo_runs_without_critic_on_policy_and_with_the_exact_kl_loss(ray_cluster, tmp_path):
    """One optimizer step per batch: the old-log-prob forward is skipped and the PPO ratio is exactly 1."""
    cfg = tiny_config(
        tmp_path, "grpo", recompute_old_log_prob=False, extra=("actor_rollout_ref.actor.kl_loss_type=full",)
    )
    trainer = build_trainer(cfg)
    trainer.init_workers()
    assert trainer.critic_wg is None
    assert trainer.ref_wg is trainer.actor_rollout_wg  # the exact KL needs actor and ref in one object
    assert not trainer.plan.recompute_old_log_prob
    last = trainer.fit()
    # no old-log-prob forward (on-policy), and no ref log-prob forward: the exact KL reads ref logits in the update
    skipped = ("timing_s/old_log_prob", "timing_s/ref")
    assert all(k in last for k in REQUIRED if k not in skipped) and all(math.isfinite(v) for v in last.values())
    assert not any(k.startswith("critic/v") or k in skipped for k in last)
    assert last["actor/ppo_kl"] == 0 and last["actor/pg_clipfrac"] == 0
    first = read_jsonl(tmp_path / "metrics.jsonl")[1]
    assert abs(first["actor/kl_loss"]) < 1e-6


@pytest.mark.parametrize("n_gpus", [pytest.param(n, marks=pytest.mark.gpu(n=n)) for n in (2, 4, 8)])
def test_gae_on_gpus(ray_cluster, tmp_path, n_gpus):
    trainer = build_trainer(tiny_config(tmp_path, "gae", device="cuda", n_workers=n_gpus))
    trainer.init_workers()
    last = trainer.fit()
    assert all(k in last for k in REQUIRED + CRITIC_REQUIRED) and all(math.isfinite(v) for v in last.values())
    assert "perf/max_memory_allocated_gb" in last and 0 < last["perf/mfu/actor"] < 1
    assert abs(read_jsonl(tmp_path / "metrics.jsonl")[1]["actor/ref_kl"]) < 1e-3  # bf16 compute on GPU


@pytest.mark.slow  # ~17 s (ReMax and GSPO, one step each without Ray: tests/algos/test_one_step.py)
def test_remax_with_gspo_loss(ray_cluster, tmp_path):
    """ReMax generates its greedy baseline in the same step; GSPO's sequence-level ratio trains."""
    cfg = tiny_config(
        tmp_path,
        "remax",
        extra=("actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.actor.kl_loss_type=k2"),
    )
    trainer = build_trainer(cfg)
    trainer.init_workers()
    last = trainer.fit()
    assert "timing_s/gen_max" in last and all(math.isfinite(v) for v in last.values())
    assert last["training/nonfinite_steps"] == 0
