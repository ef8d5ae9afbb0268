"""On-policy distillation end to end on 2 CPU workers (real Ray, gloo, FSDP2): the teacher is one more frozen role
in the colocated worker. With the student's own model as the teacher the divergence and its gradient are 0; with
another teacher the loss is positive and trains; between its forwards a teacher holds only its shard."""

import math

import pytest
from torch.distributed.tensor import DTensor

from data.builtin import prepare_builtin
from tests.e2e.dataflow_reads import assert_declared, record_reads, recorded_reads
from tests.e2e.test_ppo_e2e import read_jsonl, tiny_config
from trainer.running.build import build_trainer
from workers.parallel.fsdp import fsdp_modules


def demo_model(tmp_path, **settings) -> str:
    """The built-in demo model as ``tiny_config`` builds it (``settings`` change it: another model)."""
    built = dict(num_train=64, num_val=6, sft_warmup_steps=2, hidden_size=32) | settings
    return prepare_builtin(cache_dir=tmp_path.parent / "assets", **built)["model_path"]


def opd_config(tmp_path, teacher: str, *extra: str):
    """``tiny_config``'s GRPO on 2 workers with distillation on; the old log-probs come from their own forward."""
    return tiny_config(
        tmp_path,
        "grpo",
        extra=(
            "actor_rollout_ref.actor.use_kl_loss=false",
            "distillation.enabled=true",
            f"distillation.teacher_models.teacher_model.model_path={teacher}",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            *extra,
        ),
    )


def teacher_between_forwards(worker) -> dict:
    """What the teacher holds on this rank between its forwards: every parameter a sharded DTensor (no gathered
    copy left from the last forward), the local share of its elements, and the devices they sit on."""
    module = worker.worker_dict["teacher"].teachers["teacher_model"].module
    params = list(module.parameters())
    local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)
    return {
        "sharded": all(isinstance(p, DTensor) for p in params) and bool(fsdp_modules(module)),
        "local_share": local / sum(p.numel() for p in params),
        "devices": sorted({p.device.type for p in params}),
    }


@pytest.fixture(scope="module")
def self_distilled(ray_cluster, tmp_path_factory):
    """Two steps of distillation alone (k3) against the student's own model."""
    tmp_path = tmp_path_factory.mktemp("self_opd")
    cfg = opd_config(tmp_path, demo_model(tmp_path), "distillation.distillation_loss.use_task_rewards=false")
    trainer = build_trainer(cfg)
    trainer.init_workers()
    trainer.fused_wg.execute_all_sync("__ray_call__", record_reads)
    trainer.fit()
    reads = trainer.fused_wg.execute_all_sync("__ray_call__", recorded_reads)
    held = trainer.fused_wg.execute_all_sync("__ray_call__", teacher_between_forwards)
    return trainer, read_jsonl(tmp_path / "metrics.jsonl"), reads, held


def test_a_teacher_equal_to_the_student_gives_zero_loss_and_zero_gradient(self_distilled):
    _, records, _, _ = self_distilled
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert "timing_s/teacher" in record and all(math.isfinite(v) for v in record.values())
        assert abs(record["distillation/loss"]) < 1e-6 and abs(record["distillation/loss_max"]) < 1e-5
        # the update's loss is the distillation's alone: its gradient vanishes (the policy loss would not)
        assert record["actor/grad_norm"] < 1e-4


def test_the_teacher_phase_reads_and_writes_what_the_plan_declares(self_distilled):
    trainer, _, reads, _ = self_distilled
    assert trainer.plan.flows["step"].route("teacher").keep == ("teacher_log_probs",)  # stays on the workers
    assert_declared(trainer, reads, {"gen", "old_log_prob", "teacher", "update_actor"})


def test_between_its_forwards_a_teacher_holds_only_its_shard(self_distilled):
    """On a CPU offloading moves nothing (host memory is the device): what a teacher saves between forwards is the
    gathered copy, so each of the 2 ranks holds half of its weights (CUDA: tests/workers/test_teacher_offload.py)."""
    held = self_distilled[3]
    for rank in held:
        assert rank["sharded"] and rank["devices"] == ["cpu"]
        assert 0.4 < rank["local_share"] <= 0.6


@pytest.mark.slow  # ~19 s (the loss and its gradient: the zero-loss test above, tests/algos)
def test_opd_with_another_teacher_has_a_positive_loss_and_trains(ray_cluster, tmp_path):
    """A larger teacher of the same vocabulary (an untrained demo model of hidden size 48), the top-k forward KL
    added to the task's GRPO loss."""
    teacher = demo_model(tmp_path, hidden_size=48, sft_warmup_steps=0)
    cfg = opd_config(
        tmp_path,
        teacher,
        "distillation.distillation_loss.loss_mode=forward_kl_topk",
        "distillation.distillation_loss.topk=4",
        "distillation.distillation_loss.distillation_loss_coef=0.5",
    )
    trainer = build_trainer(cfg)
    trainer.init_workers()
    last = trainer.fit()
    assert all(math.isfinite(v) for v in last.values())
    assert last["distillation/loss"] > 0.01 and last["actor/grad_norm"] > 0
    assert 0 < last["distillation/teacher_mass"] <= 1 and 0 < last["distillation/student_mass"] <= 1
    assert "actor/pg_loss" in last and "timing_s/teacher" in last
    assert trainer.plan.flows["step"].route("teacher").keep == ("teacher_topk_ids", "teacher_topk_log_probs")
