"""The decisions ColoRL takes on a GPU, taken here with CUDA faked: ``torch.cuda.is_available``, ``device_count`` and
``get_device_properties`` patched (``set_device`` recorded), so the CUDA branch of each decision runs on a CPU-only
torch. Each test runs the production function up to the point where a real GPU would be touched; docs/gpu.md lists
what stays unchecked until one is."""

from __future__ import annotations

import os
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from config import ConfigError, resolve_device
from planner import load_config, load_with_plan
from single_controller.base import worker as worker_module
from workers.parallel import fsdp

pytestmark = pytest.mark.fake_cuda
GiB = 2**30
TINY = ["builtin.hidden_size=32", "builtin.num_layers=1", "builtin.sft_warmup_steps=0"]


class FakeCuda:
    """What torch.cuda answers: ``count`` devices of ``total_memory`` bytes; the devices ``set_device`` was given."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, count: int = 8, total_memory: int = 80 * GiB) -> None:
        self.count, self.total_memory, self.set_devices = count, total_memory, []
        self.name = "NVIDIA H100 PCIe"
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "get_device_properties", self.properties)
        monkeypatch.setattr(torch.cuda, "set_device", self.set_devices.append)

    def properties(self, device: int | torch.device = 0) -> SimpleNamespace:
        return SimpleNamespace(name=self.name, total_memory=self.total_memory, major=9, minor=0)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    return FakeCuda(monkeypatch)


def _worker_env(monkeypatch: pytest.MonkeyPatch, local_rank: int) -> None:
    env = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": str(local_rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)


# ---------------------------------------------------------------- the worker's device and process group
def test_a_worker_computes_on_the_gpu_ray_gave_it_and_that_is_its_local_rank(cuda, monkeypatch):
    _worker_env(monkeypatch, local_rank=0)  # the group's bundle index; Ray's GPU id is what counts
    monkeypatch.setattr(worker_module, "_gpus_ray_assigned", lambda: ["3"])  # ray.get_gpu_ids() in a Ray actor
    w = worker_module.Worker()
    assert w.device == torch.device("cuda", 3) and w.local_rank == 3
    assert os.environ["LOCAL_RANK"] == "3" and cuda.set_devices == [torch.device("cuda", 3)]
    assert worker_module.process_group_backend(w.device) == {"backend": "nccl", "device_id": torch.device("cuda", 3)}


def test_a_worker_without_a_gpu_or_without_cuda_computes_on_the_cpu_over_gloo(monkeypatch):
    _worker_env(monkeypatch, local_rank=1)
    monkeypatch.setattr(worker_module, "_gpus_ray_assigned", lambda: ["0"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU in Ray's books, none in torch's
    assert worker_module.Worker().device == torch.device("cpu")
    FakeCuda(monkeypatch)
    monkeypatch.setattr(worker_module, "_gpus_ray_assigned", lambda: [])  # a group on a CPU pool
    w = worker_module.Worker()
    assert w.device == torch.device("cpu") and w.local_rank == 1
    assert worker_module.process_group_backend(w.device) == {"backend": "gloo", "device_id": None}


# ---------------------------------------------------------------- precision
def test_native_precision_is_bf16_on_cuda_whatever_the_host_cpu(cuda, monkeypatch):
    monkeypatch.setattr(fsdp, "cpu_has_bf16", lambda: False)  # an AVX2 host: its own CPU would get fp32
    assert fsdp.mixed_precision(torch.device("cuda", 0), "native") == (torch.bfloat16, torch.float32)
    assert fsdp.mixed_precision(torch.device("cuda", 0), "auto") == (torch.bfloat16, torch.float32)
    assert fsdp.mixed_precision(torch.device("cpu"), "native") == (None, None)
    arr = load_config([], config_name="smollm2_arith").actor_rollout_ref
    assert arr.actor.fsdp_config.mixed_precision.param_dtype == "native"
    assert fsdp.compute_dtype(torch.device("cuda", 0), arr.actor.fsdp_config.mixed_precision) == torch.bfloat16


def test_mfu_on_a_listed_gpu_divides_by_its_datasheet_bf16_peak(cuda):
    from workers.runtime import perf

    assert perf.peak_flops(torch.device("cuda", 0), torch.bfloat16) == (
        756e12,
        "datasheet bf16 dense, NVIDIA H100 PCIe",
    )
    cuda.name = "NVIDIA H200"
    assert perf.peak_flops(torch.device("cuda", 0), torch.bfloat16)[0] == 989e12


# ---------------------------------------------------------------- trainer.device
def test_trainer_device_auto_is_cuda_when_a_gpu_is_visible(cuda, monkeypatch):
    assert resolve_device(load_config(["trainer.device=auto", *TINY])) == "cuda"
    assert resolve_device(load_config(["trainer.device=cuda", *TINY])) == "cuda"
    cuda.count = 2
    with pytest.raises(ConfigError, match=r"trainer.n_gpus_per_node=4: only 2 CUDA device\(s\) are visible"):
        resolve_device(load_config(["trainer.device=auto", "trainer.n_gpus_per_node=4", *TINY]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(load_config(["trainer.device=auto", *TINY])) == "cpu"
    with pytest.raises(ConfigError, match="trainer.device='cuda': no CUDA device is visible"):
        resolve_device(load_config(["trainer.device=cuda", *TINY]))


def test_building_the_trainer_with_device_auto_places_its_workers_on_gpus(cuda, tmp_path):
    from trainer.running.build import build_trainer

    overrides = ["trainer.device=auto", "trainer.n_gpus_per_node=2", *TINY, f"builtin.cache_dir={tmp_path}"]
    trainer = build_trainer(load_config([*overrides, f"trainer.default_local_dir={tmp_path / 'run'}"]))
    assert trainer.config.trainer.device == "cuda"  # the resource pool asks Ray for GPUs: use_gpu=device == "cuda"


# ---------------------------------------------------------------- the dry run's memory on a GPU
def _estimate(overrides: list[str]):
    from data.builtin import demo_model_config
    from trainer.preflight.dry_run import load_model_sizes
    from trainer.preflight.memory_phases import estimate_memory

    cfg, plan = load_with_plan(["trainer.device=cuda", *TINY, *overrides])
    models = load_model_sizes(cfg, plan, lambda: demo_model_config(cfg.builtin))
    return cfg, estimate_memory(cfg, plan, models, "cuda")


def _kv_cache(utilization: float) -> int:
    """The vLLM engine's KV cache term in the rollout phase of the dry run's estimate."""
    overrides = [
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={utilization}",
    ]
    _, estimate = _estimate(overrides)
    (gen,) = [p for p in estimate.phases if p.name == "gen"]
    return gen.terms["kv_cache"]


def test_vllm_reserves_gpu_memory_utilization_of_the_faked_device_in_the_dry_run(cuda):
    half, quarter = _kv_cache(0.5), _kv_cache(0.25)
    assert half - quarter == int(0.5 * cuda.total_memory) - int(0.25 * cuda.total_memory)
    assert int(0.5 * cuda.total_memory) - GiB < half < int(0.5 * cuda.total_memory)  # less the engine's weights
    cuda.total_memory = 16 * GiB  # the reservation follows the device's size
    assert half - _kv_cache(0.5) == int(0.5 * 80 * GiB) - int(0.5 * 16 * GiB)


def test_the_memory_check_compares_the_estimate_with_the_gpus_memory(cuda):
    from trainer.preflight.memory_check import check_memory, memory_limit

    assert memory_limit("cuda", 8) == (80 * GiB, "80.0 GiB of GPU memory per worker")  # each GPU's, not shared
    cfg, estimate = _estimate([])
    check_memory(cfg, estimate)  # a tiny model fits 80 GiB
    cuda.total_memory = estimate.peak.total // 2
    with pytest.raises(ConfigError, match=r"exceeds .* GiB of GPU memory per worker"):
        check_memory(cfg, estimate)


# ---------------------------------------------------------------- vLLM's CUDA branch, up to the engine
class StandInLLM:
    """vllm.LLM's surface that VLLMRollout calls, recording each call (the reload consumes its weights)."""

    def __init__(self, **kwargs) -> None:
        self.kwargs, self.calls = kwargs, []

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str]) -> None:
        self.calls.append(("wake_up", tuple(tags)))

    def collective_rpc(self, method, kwargs=None):
        if method == "reload_weights":
            names = [name for name, tensor in kwargs["weights_iterator"] if isinstance(tensor, torch.Tensor)]
            self.calls.append(("reload_weights", tuple(names)))
        else:
            self.calls.append(("rpc", getattr(method, "__name__", method)))
        return [None]

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))


@pytest.fixture
def stand_in_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=StandInLLM))


def _rollout_config(overrides: list[str] = ()):
    return load_config(["actor_rollout_ref.rollout.name=vllm", *TINY, *overrides]).actor_rollout_ref


def test_vllm_engine_arguments_on_cuda_ask_for_sleep_mode_and_the_memory_share():
    from workers.compute.vllm_engine import engine_args

    arr = _rollout_config(["actor_rollout_ref.rollout.gpu_memory_utilization=0.6"])
    model = SimpleNamespace(path="/models/x", trust_remote_code=False)
    args = engine_args(model, arr.rollout, torch.device("cuda", 0), torch.bfloat16, seed=1, rows=8, workers=8)
    assert args["enable_sleep_mode"] is True and args["gpu_memory_utilization"] == 0.6
    assert "kv_cache_memory_bytes" not in args and "distributed_executor_backend" not in args
    tp2 = _rollout_config(["actor_rollout_ref.rollout.tensor_model_parallel_size=2"]).rollout
    args = engine_args(model, tp2, torch.device("cuda", 0), torch.bfloat16, seed=1, rows=8, workers=8)
    assert args["tensor_parallel_size"] == 2 and args["distributed_executor_backend"] == "external_launcher"


def test_vllm_sleeps_between_rollouts_and_wakes_weights_before_the_sync_kv_cache_after(stand_in_vllm):
    from transformers import LlamaConfig, LlamaForCausalLM

    from workers.compute.vllm_rollout import VLLMRollout

    arr = _rollout_config()
    model = SimpleNamespace(path="/models/x", trust_remote_code=False)
    engine = VLLMRollout(model, arr.rollout, torch.device("cuda", 0), torch.bfloat16, seed=1, rows=4, workers=1)
    llm = engine.llm
    assert llm.kwargs["enable_sleep_mode"] is True and llm.calls == [("sleep", 2)] and engine.asleep
    policy = LlamaForCausalLM(
        LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    )
    llm.calls.clear()
    with engine.awake(policy):
        assert not engine.asleep
    names = tuple(name for name, _ in policy.named_parameters())
    assert llm.calls == [
        ("wake_up", ("weights",)),
        ("reload_weights", names),  # every parameter under its checkpoint name
        ("rpc", "_repack_vocab_layers"),
        ("reset_prefix_cache",),
        ("wake_up", ("kv_cache",)),
        ("sleep", 2),
    ]


def test_vllm_without_free_cache_engine_never_sleeps(stand_in_vllm):
    from workers.compute.vllm_rollout import VLLMRollout

    arr = _rollout_config(["actor_rollout_ref.rollout.free_cache_engine=false"])
    model = SimpleNamespace(path="/models/x", trust_remote_code=False)
    engine = VLLMRollout(model, arr.rollout, torch.device("cuda", 0), torch.bfloat16, seed=1, rows=4, workers=1)
    with engine.awake(torch.nn.Linear(2, 2)):
        pass
    assert [c[0] for c in engine.llm.calls] == ["reload_weights", "rpc", "reset_prefix_cache"]
