"""benchmarks.floor (each phase of a PPO step, without Ray) and benchmarks.step (the trainer's step) run end to end at
tiny sizes and print one JSON object with the documented keys."""

import math

import pytest
import torch

from tests.benchmarks.runner import TINY, R, run_benchmark


@pytest.mark.slow  # ~18 s
def test_floor_times_every_phase_of_a_ppo_step(cache_dir):
    out = run_benchmark(
        "floor",
        *TINY,
        "--algo",
        "ppo",
        "--kl",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--cache-dir",
        cache_dir,
    )
    phases = out["timing_s"]
    assert set(phases) == {"gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor"}
    assert all(t >= 0 for t in phases.values())
    assert all(phases[p] > 0 for p in ("gen", "old_log_prob", "update_actor"))
    assert 0 < out["gen_plus_train_s"] < out["gen_fwd_train_s"]
    # one on-policy optimizer step: the trainer skips the old-log-prob forward, so its floor does too
    assert out["floor_phases"] == ["gen", "ref", "values", "update_actor", "update_critic"]
    assert out["gen_plus_train_s"] < out["floor_s"] < out["gen_fwd_train_s"]
    assert out["response_tokens_per_s_gen_train"] > out["response_tokens_per_s_gen_fwd_train"] > 0
    assert 1 <= out["response_length_mean"] <= R
    assert out["n_params"] == out["trainable_params"] > 0 and out["threads"] == 1 and out["lora_rank"] == 0
    assert 0 < out["perf"]["mfu/floor"] < 1 and 0 < out["perf"]["mfu/actor"] < 1
    assert out["response_tokens_per_s_floor"] > 0 and out["peak_rss_gb"] > 0


@pytest.mark.slow  # ~12 s
def test_floor_with_lora_trains_the_adapters_and_takes_ref_from_the_base(cache_dir):
    """lora_rank > 0: the floor does a LoRA step's work (adapters only trained, ref = adapters off, no 2nd model)."""
    lora = ["--set", "actor_rollout_ref.model.lora_rank=4", "--set", "actor_rollout_ref.model.lora_alpha=8"]
    out = run_benchmark(
        "floor", *TINY, "--kl", "--steps", "1", "--warmup", "1", "--threads", "1", "--cache-dir", cache_dir, *lora
    )
    assert out["lora_rank"] == 4 and 0 < out["trainable_params"] < out["n_params"] / 2
    assert out["floor_phases"] == ["gen", "ref", "update_actor"] and out["timing_s"]["ref"] > 0
    for key in ("floor_s", "response_tokens_per_s_floor", "peak_rss_gb"):
        assert math.isfinite(out[key]) and out[key] > 0, key


@pytest.mark.slow  # ~20 s
def test_floor_breaks_memory_down_and_swaps_the_vocabulary(cache_dir):
    """--phase-memory: weights, optimizer state, KV cache and each phase's peak RSS; --vocab-size: the same model
    with another vocabulary (random weights); rollout log-probs as the old ones: no old-log-prob phase in the floor."""
    base = run_benchmark("floor", *TINY, "--steps", "1", "--warmup", "0", "--threads", "1", "--cache-dir", cache_dir)
    out = run_benchmark(
        "floor",
        *TINY,
        "--steps",
        "1",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--cache-dir",
        cache_dir,
        "--phase-memory",
        "--model-path",
        base["model_path"],
        "--vocab-size",
        "500",
        "--set",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "--set",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    )
    assert out["vocab_size"] == 500 and base["vocab_size"] < 500
    assert out["n_params"] > base["n_params"]  # the embedding (tied head) grew with the vocabulary
    assert out["floor_phases"] == ["gen", "update_actor"]  # two optimizer steps, old log-probs from the rollout
    memory = out["memory_gb"]
    assert memory["weights"] >= 0 and memory["optimizer"] >= 0 and memory["kv_cache"] >= 0
    assert {"gen", "update_actor"} <= set(memory["peak_rss_by_phase"])
    assert all(0 < v <= out["peak_rss_gb"] + 0.01 for v in memory["peak_rss_by_phase"].values())


@pytest.mark.slow  # ~25 s
def test_floor_computes_in_the_actors_configured_precision(cache_dir):
    """bf16 on CPU: the floor's models compute in bf16 (as the workers would) and MFU is against the bf16 peak."""
    bf16 = "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16"
    out = run_benchmark(
        "floor", *TINY, "--steps", "1", "--warmup", "1", "--threads", "1", "--cache-dir", cache_dir, "--set", bf16
    )
    assert out["floor_phases"] == ["gen", "update_actor"] and out["floor_s"] > 0
    # > 0 only: the CPU's bf16 peak is a matmul timed under whatever else the machine runs, so on a busy machine
    # the ratio can pass 1 (it did once in a full suite); the fp32 tests above keep the < 1 bound
    assert out["perf"]["mfu/actor"] > 0


@pytest.mark.gpu
def test_floor_and_step_run_on_cuda_in_bf16(cache_dir):
    """The same scripts on a GPU: bf16 by default there (the floor with bf16 weights and a bf16 KV cache)."""
    cuda = [*TINY[:-1], "cuda"]
    floor = run_benchmark("floor", *cuda, "--steps", "1", "--warmup", "1", "--cache-dir", cache_dir)
    step = run_benchmark("step", *cuda, "--workers", "1", "--steps", "1", "--warmup", "1", "--cache-dir", cache_dir)
    assert floor["floor_s"] > 0 and step["s_per_step"] > 0 and step["response_tokens_per_s"] > 0
    assert 0 < floor["perf"]["mfu/floor"] < 1 and 0 < step["perf"]["mfu/step"] < 1


@pytest.mark.slow  # a trainer run per worker count: ~30 s
def test_step_reports_trainer_phases_and_throughput(cache_dir):
    out = run_benchmark(
        "step",
        *TINY,
        "--algo",
        "ppo",
        "--kl",
        "--workers",
        "1",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--cache-dir",
        cache_dir,
    )
    phases = out["timing_s"]
    for phase in (
        "step",
        "gen",
        "reward",
        "ref",
        "values",
        "adv",
        "update_critic",
        "update_actor",
        "worker_gen",
        "worker_update_actor",
    ):
        assert phases[phase] >= 0, phase
    assert "old_log_prob" not in phases  # one optimizer step per batch: on-policy, that forward is skipped
    assert out["s_per_step"] == phases["step"] > phases["gen"] > 0
    assert len(out["s_per_step_all"]) == 1 and out["workers"] == 1
    assert 1 <= out["response_length_mean"] <= R
    expected = out["response_length_mean"] * 2 * 2 / out["s_per_step"]
    assert out["response_tokens_per_s"] == pytest.approx(expected, rel=0.01)
    perf = out["perf"]
    assert all(0 < perf[k] < 1 for k in ("mfu/actor", "mfu/critic", "mfu/step")) and perf["peak_tflops"] > 0
    assert 0 < perf["cpu_memory_used_gb"] <= perf["cpu_memory_peak_gb"]
    assert out["peak_rss_gb_per_worker"] == pytest.approx(perf["cpu_memory_peak_gb"], abs=1e-3)  # one step


def test_step_flops_count_each_pass_that_ran(tmp_path):
    """GRPO: generation + forward and backward = 4 forwards; PPO with a KL adds ref and the critic's 1 + 3.

    LoRA's update computes weight gradients for the adapters only."""
    import dataclasses

    from transformers import LlamaConfig

    from benchmarks.step import flops_model, step_flops
    from config import PPOConfig, replace_keys, to_config

    LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    ).save_pretrained(tmp_path)
    schema = replace_keys(PPOConfig(), {"actor_rollout_ref.model.path": str(tmp_path)})  # one epoch, no KL loss
    cfg = to_config(dataclasses.asdict(schema))
    metrics = {
        "prompt_length/mean": 5.0,
        "response_length/mean": 3.0,
        "timing_s/gen": 1.0,
        "timing_s/update_actor": 1.0,
    }
    forward = flops_model(str(tmp_path)).forward_flops(torch.full((4,), 8))
    assert step_flops(cfg, metrics, 4) == 4 * forward
    critic = flops_model(str(tmp_path), value_model=True).forward_flops(torch.full((4,), 8))
    assert critic < forward  # a scalar head instead of the lm_head
    ppo = {**metrics, "timing_s/ref": 1.0, "timing_s/values": 1.0, "timing_s/update_critic": 1.0}
    assert step_flops(cfg, ppo, 4) == pytest.approx(5 * forward + 4 * critic)
    lora = flops_model(str(tmp_path), lora_rank=4)
    lora_cfg = to_config(dataclasses.asdict(replace_keys(schema, {"actor_rollout_ref.model.lora_rank": 4})))
    lengths = torch.full((4,), 8)
    assert step_flops(lora_cfg, metrics, 4) == lora.forward_flops(lengths) + lora.train_flops(lengths) < 4 * forward
