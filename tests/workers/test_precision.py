"""bf16 compute: which dtypes a role gets, which attention kernel its updates use, and a bf16 worker through Ray."""

import dataclasses
import math
import platform
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from config.sections import (
    ActorRolloutRefConfig,
    FSDPConfig,
    MixedPrecisionConfig,
    ModelConfig,
    RefConfig,
    RefFSDPConfig,
    RolloutConfig,
)
from single_controller import DataProto, RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.workers.helpers import actor_config, free_port, init_gloo, make_prompts, worker_config
from workers.checkpoint.shards import PlainReader
from workers.compute import attention
from workers.parallel import fsdp
from workers.roles.fsdp_workers import ActorRolloutRefWorker
from workers.roles.role import shard_role

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
P, R, N, PROMPTS = 6, 5, 2, 4


def test_auto_is_bf16_on_cuda_and_fp32_elsewhere():
    assert fsdp.mixed_precision(CPU) == (None, None)  # plain fp32: one CPU rank stays unsharded
    assert fsdp.mixed_precision(CUDA) == (torch.bfloat16, torch.float32)
    assert fsdp.mixed_precision(CPU, "bf16") == (torch.bfloat16, torch.float32)
    assert fsdp.mixed_precision(CPU, "bf16", "bf16") == (torch.bfloat16, torch.bfloat16)
    assert fsdp.mixed_precision(CUDA, "fp32") == (None, None)
    assert fsdp.mixed_precision(CPU, "fp32", "bf16") == (None, torch.bfloat16)
    assert fsdp.mixed_precision(CPU, "bfloat16", "float32") == (torch.bfloat16, torch.float32)  # verl's spellings


def test_native_is_bf16_where_the_device_multiplies_it_natively():
    """smollm2_arith's choice: bf16 on CUDA and on a CPU with bf16 instructions, fp32 (no warning) elsewhere."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        on_cpu = fsdp.mixed_precision(CPU, "native")
    assert on_cpu == ((torch.bfloat16, torch.float32) if fsdp.cpu_has_bf16() else (None, None))
    assert fsdp.mixed_precision(CUDA, "native") == (torch.bfloat16, torch.float32)


@pytest.mark.skipif(
    platform.machine() != "x86_64" or not Path("/proc/cpuinfo").exists(), reason="reads x86 Linux's CPU flags"
)
def test_native_bf16_is_the_cpus_bf16_instructions_not_avx512():
    """The kernel's own flags decide: an AVX-512 CPU without AVX512-BF16 or AMX emulates bf16 (oneDNN still calls
    bf16 "supported" there), so ``native`` must stay fp32 on it."""
    flags = set(
        next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    )
    assert fsdp.cpu_has_bf16() == bool(flags & {"avx512_bf16", "amx_bf16"})


def test_bf16_on_a_cpu_that_emulates_it_warns_with_the_key():
    """Without AVX512-BF16 or AMX a bf16 matmul runs ~100x slower than fp32: say so, do not just crawl."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fsdp.mixed_precision(CPU, "bf16")
        fsdp.mixed_precision(CPU)  # auto: fp32 on a CPU, nothing to warn about
        fsdp.mixed_precision(CUDA, "bf16")
    messages = [str(w.message) for w in caught if "mixed_precision" in str(w.message)]
    assert len(messages) == (0 if fsdp.cpu_has_bf16() else 1)
    assert all(m.startswith("fsdp_config.mixed_precision.param_dtype=bf16 on a CPU without") for m in messages)


ONE_RANK = SimpleNamespace(device=CPU, world_size=1)  # what shard_role reads of its worker
BF16_FSDP = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="bf16"))


def test_a_single_bf16_rank_runs_without_fsdp(tiny_model_dir):
    """Trained: a bf16 compute copy of fp32 masters; frozen: cast once. No FSDP, no process group needed."""
    trained, weights = shard_role(
        ONE_RANK, AutoModelForCausalLM.from_pretrained(tiny_model_dir), BF16_FSDP, trained=True
    )
    assert weights is not None and trained is weights.module and not fsdp.is_fsdp(trained)
    assert trained.dtype == torch.bfloat16 and weights.master.dtype == torch.float32
    frozen, none = shard_role(ONE_RANK, AutoModelForCausalLM.from_pretrained(tiny_model_dir), BF16_FSDP)
    assert none is None and frozen.dtype == torch.bfloat16 and not fsdp.is_fsdp(frozen)


def _offloaded_rank_groups(rank: int, port: int, model_dir: str, out: str) -> None:
    init_gloo(rank, 1, port)
    offloaded = dataclasses.replace(BF16_FSDP, param_offload=True)
    model, weights = shard_role(ONE_RANK, AutoModelForCausalLM.from_pretrained(model_dir), offloaded, trained=True)
    torch.save({"weights": weights, "groups": [name for name, m in model.named_modules() if fsdp.is_fsdp(m)]}, out)
    dist.destroy_process_group()


def test_an_offloaded_single_bf16_rank_gets_one_fsdp_group(tiny_model_dir, tmp_path):
    """FSDP moves the fp32 parameters of an offloaded role; on one rank it only casts, so one group (the root)."""
    out = str(tmp_path / "groups.pt")
    mp.spawn(_offloaded_rank_groups, args=(free_port(), tiny_model_dir, out), nprocs=1, join=True)
    assert torch.load(out, weights_only=False) == {"weights": None, "groups": [""]}


def test_short_bf16_cpu_updates_take_the_math_attention_kernel(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert attention.head_dim(model) <= attention.MATH_MAX_HEAD_DIM
    with attention.sdpa_backend(model, CPU, torch.bfloat16, attention.MATH_MAX_SEQ_LEN):
        assert not torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()  # restored on exit
    for device, dtype, length in (
        (CPU, torch.float32, 16),
        (CPU, torch.bfloat16, attention.MATH_MAX_SEQ_LEN + 1),
        (CUDA, torch.bfloat16, 16),
    ):
        with attention.sdpa_backend(model, device, dtype, length):
            assert torch.backends.cuda.flash_sdp_enabled()


@pytest.mark.slow  # a Ray worker in bf16, emulated on CPUs without bf16 instructions: ~25 s
@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(300)
def test_a_bf16_cpu_worker_samples_updates_and_saves_fp32_weights(tiny_model_dir, tmp_path):
    """One CPU rank in bf16, without FSDP: bf16 compute weights, fp32 master weights (saved and loaded)."""
    bf16 = MixedPrecisionConfig(param_dtype="bf16")
    arr = ActorRolloutRefConfig(
        model=ModelConfig(path=tiny_model_dir),
        actor=actor_config(ppo_mini_batch_size=PROMPTS, fsdp_config=FSDPConfig(mixed_precision=bf16)),
        rollout=RolloutConfig(n=N, prompt_length=P, response_length=R, log_prob_micro_batch_size_per_gpu=4),
        ref=RefConfig(log_prob_micro_batch_size_per_gpu=4, fsdp_config=RefFSDPConfig(mixed_precision=bf16)),
    )
    cfg, plan = worker_config(arr, n_workers=1, prompts=PROMPTS)
    cls = RayClassWithInitArgs(ActorRolloutRefWorker, config=cfg.actor_rollout_ref, role="actor_rollout_ref", plan=plan)
    group = RayWorkerGroup(RayResourcePool([1], use_gpu=False), cls)
    group.init_model(total_training_steps=2)
    ids, mask, pos = make_prompts(PROMPTS, P)
    prompts = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos}).repeat(N)
    gen = group.generate_sequences(prompts)  # the static KV cache in bf16
    assert gen.batch["responses"].shape == (PROMPTS * N, R)
    old = group.compute_log_prob(gen).batch["old_log_probs"]
    ref = group.compute_ref_log_prob(gen).batch["ref_log_prob"]
    assert old.dtype == torch.float32 and torch.equal(old, ref)  # same weights, same bf16 compute: KL 0 at step 0

    batch = gen.union(DataProto.from_dict({"old_log_probs": old, "ref_log_prob": ref}))
    batch.batch["advantages"] = torch.randn(PROMPTS * N, R, generator=torch.Generator().manual_seed(0))
    metrics = group.update_actor(batch).meta_info["metrics"]
    assert all(math.isfinite(v) for values in metrics.values() for v in values)
    assert 0 < metrics["perf/mfu/actor"][0] < 1
    assert not torch.equal(group.compute_log_prob(gen).batch["old_log_probs"], old)

    updated = group.compute_log_prob(gen).batch["old_log_probs"]
    group.save_checkpoint(str(tmp_path / "actor"))
    saved = PlainReader(tmp_path / "actor").read_metadata().state_dict_metadata
    # the fp32 master weights, not their bf16 compute copies
    assert {m.properties.dtype for k, m in saved.items() if k.startswith("model.")} == {torch.float32}
    group.update_actor(batch)
    group.load_checkpoint(str(tmp_path / "actor"))  # the masters, and the bf16 weights computed from them
    assert torch.equal(group.compute_log_prob(gen).batch["old_log_probs"], updated)
