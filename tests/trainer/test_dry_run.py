"""``trainer.dry_run=true``: a step's batch arithmetic and the memory per worker, before anything loads; and the
pre-flight refusal of a run whose estimated peak memory exceeds the device."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config import ConfigError, replace_keys
from planner import load_config, make_plan, num_workers
from tests.verl_compat.cli import commands
from trainer.preflight.dry_run import (
    _estimate,
    load_model_sizes,
    phase_batches,
    preflight,
    rollout_engine_line,
)
from trainer.preflight.memory_phases import estimate_memory
from workers.compute.vllm_engine import cpu_kv_cache_bytes

REPO = Path(__file__).resolve().parent.parent.parent
HF = "actor_rollout_ref.rollout.name=hf"
QWEN2_5_0_5B = {  # Qwen2.5-0.5B-Instruct's config.json, the fields that size it
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1e6,
}


def _main(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(REPO / "main.py"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _rows(stdout: str, first_word: str) -> list[list[str]]:
    """The words of each line starting with ``first_word``: a phase's batch row, then its memory row."""
    return [line.split() for line in stdout.splitlines() if line.split()[:1] == [first_word]]


@pytest.fixture(scope="module")
def qwen_config_dir(tmp_path_factory) -> str:
    """A model directory with only a config.json: all a dry run reads."""
    path = tmp_path_factory.mktemp("qwen2_5_0_5b")
    (path / "config.json").write_text(json.dumps(QWEN2_5_0_5B))
    return str(path)


def test_dry_run_of_the_demo_prints_the_arithmetic_and_starts_nothing(tmp_path):
    cache = tmp_path / "cache"
    result = _main(["trainer.dry_run=true", f"builtin.cache_dir={cache}"], tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # 16 prompts × 8 responses over 2 workers; one mini-batch of 64 rows in one micro-batch; up to 16 + 8 tokens
    assert "a step: 16 prompts × 8 responses = 128 sequences, 64 per worker, each up to 16 + 8 tokens" in out
    assert _rows(out, "gen")[0] == ["gen", "64", "64", "1", "-", "-", "1536"]
    assert _rows(out, "update_actor")[0] == ["update_actor", "64", "64", "1", "1", "1", "1536"]
    assert "training steps: 700 = 5.60 epochs of 125 steps (2000 prompts / data.train_batch_size)" in out
    for phase in ("load", "gen", "validate", "update_actor"):  # the memory table: every term and the total
        assert len(_rows(out, phase)[-1]) == 9
    assert "peak: 0." in out and "fits" in out
    assert not cache.exists()  # the demo's assets (its weights) were not built
    assert "Started a local Ray instance" not in result.stderr


def test_dry_run_arithmetic_of_verls_grpo_command_line(qwen_config_dir, capsys):
    """examples/grpo_trainer/run_qwen2-7b.sh on 2 workers: 1024 prompts × 5 = 5120 sequences, 2560 per worker;
    the mini-batch of 256 prompts is 640 sequences per worker: 4 optimizer steps a step, each of 16 micro-batches
    of 40; old and ref log-probs in micro-batches of 40 (the script samples with vLLM, whose log-probs verl takes
    as the old ones in bypass mode only); sequences up to 512 + 1024 tokens."""
    cfg = load_config(
        commands.overrides(
            commands.GRPO, model=qwen_config_dir, train="/nonexistent/train.parquet", val="/nonexistent/test.parquet"
        )
        + ["trainer.device=cpu", "trainer.dry_run=true"]
    )
    plan = make_plan(cfg, num_workers(cfg))
    batches = {b.name: b for b in phase_batches(cfg, plan)}
    assert list(batches) == ["gen", "old_log_prob", "ref", "update_actor"]
    tokens = 2560 * (512 + 1024)
    assert (batches["gen"].rows, batches["gen"].tokens) == (2560, tokens)
    assert (batches["ref"].micro, batches["ref"].micro_batches) == (40, 64)
    assert (batches["old_log_prob"].micro, batches["old_log_prob"].micro_batches) == (40, 64)
    update = batches["update_actor"]
    assert (update.micro, update.grad_accum, update.optimizer_steps, update.micro_batches, update.tokens) == (
        40,
        16,
        4,
        64,
        tokens,
    )
    with pytest.raises(SystemExit) as exit_:
        preflight(cfg, plan, demo_config=None)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "actor: 494.03 M parameters (494.03 M trained), 24 layers, hidden 896, vocabulary 151936" in out
    assert "training steps: unknown (the training files cannot be read)" in out
    assert _rows(out, "update_actor")[0] == ["update_actor", "2560", "40", "64", "16", "4", str(tokens)]


def test_a_run_whose_estimate_exceeds_the_device_is_refused_before_anything_loads(qwen_config_dir, tmp_path):
    """verl's GRPO command line with responses of up to 50,000 tokens: the rollout's KV cache alone is
    terabytes."""
    args = commands.overrides(
        commands.GRPO, model=qwen_config_dir, train=str(tmp_path / "train.parquet"), val=str(tmp_path / "test.parquet")
    )
    # the HF rollout's cache holds every row at once (vLLM's, capped by its reservation, queues them instead)
    fused = "actor_rollout_ref.model.use_fused_kernels=true"  # no (tokens, vocabulary) logits: the KV cache leads
    result = _main([*args, "trainer.device=cpu", "data.max_response_length=50000", fused, HF], tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("colorl: config error: the estimated peak memory per worker, ")
    assert " GiB of host RAM for 2 worker(s); to bring it down: " in line
    # the rollout's KV cache of 50,000-token responses is the largest term; the keys that shrink it are named
    assert "in gen (largest: kv_cache " in line
    assert "to bring it down: data.train_batch_size or actor_rollout_ref.rollout.n or data.max_response_length" in line
    assert line.endswith("trainer.check_memory=false skips this check")
    assert "Started a local Ray instance" not in result.stdout + result.stderr


def test_the_estimate_counts_the_vllm_engines_reservation(qwen_config_dir):
    """rollout.name=vllm on a CPU: the engine's weights stay beside the actor's shards after loading, its KV cache
    is its reservation (the step's rows in whole blocks, within gpu_memory_utilization of RAM over the workers),
    and the sync gathers one unit at a time instead of the whole model."""
    args = [
        *commands.overrides(commands.GRPO, model=qwen_config_dir, train="t.parquet", val="v.parquet"),
        "trainer.device=cpu",
        "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    ]
    vllm_cfg, hf_cfg = load_config(args), load_config([*args, HF])
    (models, vllm), (_, hf) = (_estimate(c, make_plan(c, num_workers(c)), None) for c in (vllm_cfg, hf_cfg))
    phases = {name: {p.name: p for p in e.phases} for name, e in (("vllm", vllm), ("hf", hf))}
    layers, kv_dim = 24, 2 * 64  # Qwen2.5-0.5B: 2 KV heads of 64
    engine = 4 * models["actor"].params  # the engine's fp32 copy (a CPU computes in fp32 by default)
    rollout, rows = vllm_cfg.actor_rollout_ref.rollout, 16 * 5 // 2
    assert phases["vllm"]["gen"].terms["kv_cache"] == cpu_kv_cache_bytes(rollout, layers, kv_dim, 4, rows, 2)
    for name in ("update_actor", "load"):  # the engine starts after the actor is sharded: from loading on
        assert phases["vllm"][name].terms["runtime"] > phases["hf"][name].terms["runtime"]
    assert phases["vllm"]["update_actor"].terms["weights"] == phases["hf"]["update_actor"].terms["weights"] + engine
    assert phases["vllm"]["gen"].terms["weights"] < phases["hf"]["gen"].terms["weights"] + engine


def test_the_check_is_switched_off_by_its_key(qwen_config_dir):
    """Micro-batches of 64 × 4,096 tokens without checkpointing: the update's activations are the peak, and the
    message names the keys that shrink them."""
    base = commands.overrides(commands.GRPO, model=qwen_config_dir, train="t.parquet", val="v.parquet")
    cfg = load_config(
        [
            *base,
            "trainer.device=cpu",
            "data.max_response_length=4096",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
            "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        ]
    )
    plan = make_plan(cfg, num_workers(cfg))
    with pytest.raises(ConfigError, match=r"exceeds .* GiB of host RAM.* in update_actor|in update_actor .*exceeds"):
        preflight(cfg, plan, demo_config=None)
    with pytest.raises(
        ConfigError,
        match=r"\(largest: activations .*to bring it down: actor_rollout_ref\.actor\."
        r"ppo_micro_batch_size_per_gpu \(lower\), actor_rollout_ref\.model\."
        r"enable_gradient_checkpointing=true",
    ):
        preflight(cfg, plan, demo_config=None)
    preflight(replace_keys(cfg, {"trainer.check_memory": False}), plan, demo_config=None)  # no error


def test_a_missing_model_config_is_a_config_error(tmp_path):
    cfg = load_config(
        [
            f"actor_rollout_ref.model.path={tmp_path / 'none'}",
            "data.train_files=t",
            "data.val_files=v",
            "actor_rollout_ref.actor.use_dynamic_bsz=true",  # no micro-batch sizes to set
            "critic.use_dynamic_bsz=true",
            "trainer.device=cpu",
            "trainer.dry_run=true",
        ]
    )
    with pytest.raises(ConfigError, match="actor_rollout_ref.model.path=.*no model config there"):
        preflight(cfg, make_plan(cfg, num_workers(cfg)), demo_config=None)


def test_the_dry_run_and_the_memory_estimate_count_the_teacher(qwen_config_dir, capsys):
    """verl's GRPO command line with a teacher of the student's size: the teacher's forward is a phase with the
    old log-probs' micro-batches, its model is listed, and its weights are in the estimate: its FSDP shard in every
    phase on a CPU (host memory is the device), on CUDA only in its own phase (offloaded between forwards)."""
    base = [
        *commands.overrides(commands.GRPO, model=qwen_config_dir, train="t.parquet", val="v.parquet"),
        "trainer.dry_run=true",
    ]
    teacher = ["distillation.enabled=true", f"distillation.teacher_models.teacher_model.model_path={qwen_config_dir}"]
    for device in ("cpu", "cuda"):
        plain = load_config([*base, f"trainer.device={device}"])
        cfg = load_config([*base, f"trainer.device={device}", *teacher])
        plan = make_plan(cfg, num_workers(cfg))
        batches = {b.name: b for b in phase_batches(cfg, plan)}
        # vLLM's log-probs are the old ones in bypass mode only (verl's rule): the old-log-prob forward runs
        assert list(batches) == ["gen", "old_log_prob", "ref", "teacher", "update_actor"]
        assert (batches["teacher"].micro, batches["teacher"].micro_batches) == (40, 64)
        models = load_model_sizes(cfg, plan, demo_config=None)
        assert models["teacher"].params == models["actor"].params
        with_teacher = {p.name: p for p in estimate_memory(cfg, plan, models, device).phases}
        without = {p.name: p for p in estimate_memory(plain, make_plan(plain, 2), models, device).phases}
        shard = 4 * models["teacher"].params // 2  # fp32 shards over 2 workers
        extra = with_teacher["update_actor"].terms["weights"] - without["update_actor"].terms["weights"]
        assert extra == (shard if device == "cpu" else 0)
        # the teacher's forward gathers what the reference's does (the same model), beside its own shard; on CUDA
        # this command line offloads the reference too (ref.fsdp_config.param_offload=True): one shard for the other
        own = shard if device == "cpu" else 0
        assert with_teacher["teacher"].terms["weights"] == without["ref"].terms["weights"] + own
    with pytest.raises(SystemExit):
        preflight(load_config([*base, "trainer.device=cpu", *teacher]), plan, demo_config=None)
    out = capsys.readouterr().out
    assert "  teacher: 494.03 M parameters (494.03 M trained)" in out and _rows(out, "teacher")[0][1:3] == [
        "2560",
        "40",
    ]


def test_the_dry_run_prints_the_rollout_groups_arithmetic_and_memory(qwen_config_dir, capsys):
    """separate_async on 2 + 2 workers (verl's defaults: 1024 prompts, 4 updates of 256 a step): the rollout group
    generates the 1024 sequences over its own 2 workers, 512 each, with its own memory at generation."""
    separate = ["trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"]
    separate += ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"]
    separate += ["actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=2"]
    model = f"actor_rollout_ref.model.path={qwen_config_dir}"
    cfg = load_config(["trainer.device=cpu", "trainer.dry_run=true", "trainer.n_gpus_per_node=2", model, *separate])
    with pytest.raises(SystemExit):
        preflight(cfg, make_plan(cfg, num_workers(cfg)), demo_config=None)
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("rollout group"))
    assert "2 worker(s) (actor_rollout_ref.rollout.nnodes=1 × n_gpus_per_node=2) beside the trainer's 2" in line
    assert "512 sequences per worker, generated 1 step(s) ahead of training" in line and "GiB per worker" in line


@pytest.mark.parametrize("dtype, nbytes", [("fp32", 4), ("bf16", 2)])
def test_the_generation_estimate_counts_loras_merged_copy_in_the_compute_dtype(qwen_config_dir, dtype, nbytes):
    """LoRA samples with merged copies of its linears (``lora.merged_adapters``), in bf16 too: the gen phase's
    weights hold them at the compute dtype's bytes."""
    cfg = load_config(
        [
            *commands.overrides(commands.GRPO, model=qwen_config_dir, train="t.parquet", val="v.parquet"),
            HF,
            "trainer.device=cpu",
            "actor_rollout_ref.model.lora_rank=8",
            f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={dtype}",
        ]
    )
    plan = make_plan(cfg, num_workers(cfg))
    models, estimate = _estimate(cfg, plan, None)
    unmerged = {**models, "actor": dataclasses.replace(models["actor"], merged=0)}
    without = estimate_memory(cfg, plan, unmerged, "cpu")
    gen = {e: next(p for p in x.phases if p.name == "gen") for e, x in (("with", estimate), ("without", without))}
    assert models["actor"].merged > 0
    assert gen["with"].terms["weights"] - gen["without"].terms["weights"] == nbytes * models["actor"].merged


@pytest.mark.parametrize("setting", ["auto", "true", "false"])
def test_the_dry_run_names_the_rollout_engine_and_its_decode_step(setting):
    cfg = load_config(["trainer.dry_run=true", HF, f"actor_rollout_ref.rollout.compile_decode={setting}"])
    rollout = cfg.actor_rollout_ref.rollout
    own = {"true": "the own step, compiled per batch bucket", "auto": "the own step, eager per batch bucket"}
    for device, auto in (("cpu", own["auto"]), ("cuda", "the HF loop")):  # auto: eager on a CPU only
        decode = {**own, "auto": auto}.get(setting, "the HF loop")
        want = f"rollout: hf (rollout.name), decode step: {decode} (rollout.compile_decode={setting})"
        assert rollout_engine_line(rollout, device) == want
