"""verl's subtrees of machinery ColoRL does not have, with verl's defaults (``config.tree.InertTree``s).

Profilers (Nsight, the NPU and torch profilers, memory snapshots, the precision debugger), Ray's ``runtime_env``,
the transfer queue, the rollout dumps replayed instead of generating, quantisation-aware training, torchtitan's
plan, Megatron's LoRA, multi-token prediction, the roles' checkpoint contents; and the core's ``trainer.v1`` and
``rollout.engine_kwargs`` with verl's further keys. The loader checks a user's keys against their defaults and keeps
the values as given; ``inert`` warns about, or refuses, values other than the defaults.
ColoRL's timing is the one line per phase of every step and ``benchmarks/`` (py-spy, the memory estimate).
"""

from __future__ import annotations

from typing import Any, ClassVar

from config import machinery, sections
from config.tree import InertTree


class RuntimeEnvTree(InertTree):
    """Ray's ``runtime_env`` (free-form: ``+ray_kwargs.ray_init.runtime_env.env_vars.X=1``)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"py_executable": None}
    OPEN: ClassVar[bool] = True


_TOOL = "verl.utils.profiler.config."
_PRECISION_DEBUGGER = {
    "_target_": _TOOL + "PrecisionDebuggerToolConfig",
    "config_path": None,
    "steps": None,
    "stages": None,
    "strict": False,
}
_COMMON = {
    "_target_": "verl.utils.profiler.ProfilerConfig",
    "tool": None,
    "enable": False,
    "all_ranks": False,
    "ranks": [],
    "save_path": "outputs/profile",
    "relocate_results": False,
    "finish_hook_cmd": None,
    "finish_hook_all_ranks": False,
    "finish_hook_ranks": [],
}


class ProfilerTree(InertTree):
    """A trained or reference role's ``profiler``."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        **_COMMON,
        "tool_config": {
            "nsys": {"_target_": _TOOL + "NsightToolConfig", "discrete": False},
            "npu": {
                "_target_": _TOOL + "NPUToolConfig",
                "contents": [],
                "level": "level0",
                "analysis": True,
                "discrete": False,
            },
            "torch": {
                "_target_": _TOOL + "TorchProfilerToolConfig",
                "contents": [],
                "discrete": False,
                "schedule": {
                    "_target_": _TOOL + "TorchProfilerScheduleConfig",
                    "skip_first": 0,
                    "wait": 0,
                    "warmup": 0,
                    "active": 0,
                    "repeat": 0,
                },
            },
            "torch_memory": {
                "_target_": _TOOL + "TorchMemoryToolConfig",
                "trace_alloc_max_entries": 100000,
                "stack_depth": 32,
                "memory_snapshot_num_steps": 1,
            },
            "precision_debugger": _PRECISION_DEBUGGER,
        },
    }


class RolloutProfilerTree(InertTree):
    """The rollout's ``profiler`` (per-token ranges of the inference engine)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        **_COMMON,
        "tool_config": {
            "npu": {
                "_target_": _TOOL + "NPUToolConfig",
                "contents": [],
                "level": "level0",
                "analysis": True,
                "discrete": False,
                "profile_token_start": None,
                "profile_token_end": None,
            },
            "torch": {
                "_target_": _TOOL + "TorchProfilerToolConfig",
                "contents": [],
                "discrete": False,
                "profile_token_start": None,
                "profile_token_end": None,
            },
            "precision_debugger": _PRECISION_DEBUGGER,
        },
    }


class GlobalProfilerTree(InertTree):
    """``global_profiler``: which steps the role profilers record, and the tools' global options."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.utils.profiler.ProfilerConfig",
        "tool": None,
        "steps": None,
        "profile_continuous_steps": False,
        "save_path": "outputs/profile",
        "relocate_results": False,
        "finish_hook_cmd": None,
        "finish_hook_all_ranks": False,
        "finish_hook_ranks": [],
        "global_tool_config": {
            "nsys": {
                "_target_": _TOOL + "NsightToolConfig",
                "discrete": False,
                "controller_nsight_options": {
                    "trace": "cuda,nvtx,cublas,ucx",
                    "cuda-memory-usage": "true",
                    "cuda-graph-trace": "graph",
                },
                "worker_nsight_options": {
                    "trace": "cuda,nvtx,cublas,ucx",
                    "cuda-memory-usage": "true",
                    "cuda-graph-trace": "graph",
                    "capture-range": "cudaProfilerApi",
                    "capture-range-end": None,
                    "kill": "none",
                },
            },
            "torch_memory": {
                "trace_alloc_max_entries": 100000,
                "stack_depth": 32,
                "memory_snapshot_num_steps": 1,
                "context": "all",
                "stacks": "all",
                "kw_args": {},
            },
            "precision_debugger": _PRECISION_DEBUGGER,
        },
    }


class TransferQueueTree(InertTree):
    """verl's distributed data store between the driver and the workers; ColoRL's is the per-worker step store."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "enable": False,
        "metrics": {"enabled": False, "port": 0},
        "backend": {
            "storage_backend": "SimpleStorage",
            "SimpleStorage": {"total_storage_size": 100000, "num_data_storage_units": 8},
            "MooncakeStore": {
                "auto_init": False,
                "metadata_server": "localhost:50123",
                "master_server_address": "localhost:50124",
                "local_hostname": "localhost",
                "protocol": "tcp",
                "global_segment_size": 4294967296,
                "local_buffer_size": 1073741824,
                "device_name": "",
            },
        },
    }


_SKIP = {"enable": False, "dump_dir": "~/.verl/rollout_dump", "steps": [], "action": "cache"}


class SkipTree(InertTree):
    """verl's rollout dumps replayed instead of generating (a debugging aid): not in ColoRL."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.utils.skip.SkipManagerConfig",
        "rollout": _SKIP,
        "rollout_tq": _SKIP,
        "async_rollout": _SKIP,
    }


class CustomClsTree(InertTree):
    """``data.custom_cls``: a dataset class of the user's."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"path": None, "name": None}


class PFPPOTree(InertTree):
    """``algorithm.pf_ppo``: policy-filtered PPO's reweighting of samples by reward."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"reweight_method": "pow", "weight_pow": 2.0}


class QATTree(InertTree):
    """Quantisation-aware training (verl's ``qat``): not in ColoRL; enabling it is refused (``cli.inert``)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.workers.config.QATEngineConfig",
        "enable": False,
        "mode": "w4a16",
        "group_size": 16,
        "ignore_patterns": ["lm_head", "embed_tokens", "re:.*mlp.gate$"],
        "activation_observer": "static_minmax",
        "quantization_config_path": None,
    }


class TurboTree(InertTree):
    """torchtitan's sharding plan (``strategy=fsdp_turbo``): not in ColoRL."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "distributed": {
            "fully_shard_parallel_size": 16,
            "tensor_parallel_size": 1,
            "expert_parallel_size": 1,
            "expert_fully_shard_parallel_size": 1,
            "ulysses_parallel_size": 1,
            "fsdp_plan": {
                "param_dtype": "bf16",
                "reduce_dtype": "fp32",
                "output_dtype": "bf16",
                "fsdp_implementation": "native",
                "num_to_forward_prefetch": 1,
                "num_to_backward_prefetch": 1,
            },
        }
    }


class CheckpointTree(InertTree):
    """verl's ``checkpoint`` section of a trained role: ColoRL saves and resumes the whole state (``cli.inert``)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.trainer.config.CheckpointConfig",
        "save_contents": ["model", "optimizer", "extra"],
        "load_contents": ["model", "optimizer", "extra"],
        "async_save": False,
        "strict": True,
    }


class CriticCheckpointTree(InertTree):
    DEFAULTS: ClassVar[dict[str, Any]] = {k: v for k, v in CheckpointTree.DEFAULTS.items() if k != "strict"}


class ActorQATTree(InertTree):
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "enable": False,
        "mode": "w4a16",
        "group_size": 16,
        "ignore_patterns": ["lm_head", "embed_tokens", "re:.*mlp.gate$"],
        "activation_observer": "static_minmax",
        "quantization_config_path": None,
    }


class MtpTree(InertTree):
    """Multi-token prediction heads (verl's ``mtp``): not in ColoRL; enabling them is refused."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.workers.config.MtpConfig",
        "enable": False,
        "enable_train": False,
        "enable_rollout": False,
        "detach_encoder": False,
        "mtp_loss_scaling_factor": 0.1,
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "method": "mtp",
        "num_speculative_tokens": 1,
    }


class MegatronLoraTree(InertTree):
    """Megatron's LoRA (verl's ``model.lora``, read by its Megatron engine only); ColoRL's LoRA is ``lora_rank``."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "type": "lora",
        "merge": False,
        "rank": 0,
        "alpha": 32,
        "dropout": 0.0,
        "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
        "exclude_modules": [],
        "dropout_position": "pre",
        "lora_A_init_method": "xavier",
        "lora_B_init_method": "zero",
        "a2a_experimental": False,
        "dtype": None,
        "adapter_path": None,
        "freeze_vision_model": True,
        "freeze_vision_projection": True,
        "freeze_language_model": True,
    }


class FusedKernelOptionsTree(InertTree):
    DEFAULTS: ClassVar[dict[str, Any]] = {"impl_backend": "torch"}


class TiledMLPTree(InertTree):
    DEFAULTS: ClassVar[dict[str, Any]] = {"enabled": False, "num_shards": 4}


class TrainerV1Tree(machinery.TrainerV1Tree):
    """``trainer.v1`` with verl's keys ColoRL does not read: the hybrid rollout switch, the sampler's refill and
    custom sampler."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "trainer_mode": "sync",
        "sync": {},
        "colocate_async": {"num_warmup_batches": 1},
        "separate_async": {
            "num_warmup_batches": 1,
            "parameter_sync_step": 4,
            "hybrid_rollout": {
                "_target_": "verl.trainer.config.HybridRolloutSwitchConfig",
                "enable_switch": False,
                "switch_threshold_ratio": 0.4,
                "adaptive_switch_threshold": True,
                "switch_threshold_step_up": 0.05,
                "switch_threshold_step_down": 0.03,
                "switch_threshold_release_steps": 2,
                "switch_cost_window_size": 3,
            },
        },
        "sampler": {
            "max_off_policy_threshold": 8,
            "max_off_policy_strategy": "drop",
            "sync_refill_failed_groups": False,
            "custom_sampler": {"path": None, "name": None},
            "sampler_kwargs": {},
        },
    }


class EngineKwargsTree(sections.rollout.EngineKwargsTree):
    """``rollout.engine_kwargs`` with the sections of verl's other inference engines (SGLang, TensorRT-LLM)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"vllm": {}, "sglang": {}, "trtllm": {}}
