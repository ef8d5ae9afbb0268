"""verl's keys nothing in ColoRL reads, per core section, with verl's defaults: ``VERL_ONLY``.

Each entry adds keys to a core section (``schema`` builds the subclasses); a subtree of verl's machinery is its
``InertTree`` type alone (``trees``, ``servers``), a section of its own its dataclass (``legacy``, ``servers``).
The checks an entry names run in the subclass's ``__post_init__``, after the core section's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

from config import distillation, machinery, sections
from config import schema as core
from config.checks import ConfigError, optional_positive_int, positive, positive_int
from config.sections import reward
from verl_compat.cli import legacy, servers, trees


@dataclasses.dataclass(frozen=True)
class Keys:
    """A core section's verl-only keys: ``(name, type, default)`` each (an ``InertTree`` type alone: its
    ``DEFAULTS``), and the range checks its ``__post_init__`` adds (``check(section)``, raising ``ConfigError``)."""

    fields: tuple[tuple[Any, ...], ...]
    check: Callable[[Any], None] | None = None


Strategy = Literal["fsdp", "fsdp2"]  # ColoRL shards with FSDP2; verl's FSDP1 ("fsdp") computes the same numbers
ACTOR_TARGET = "verl.workers.config.FSDPActorConfig"


def _micro_batches(section: Any, *global_keys: str) -> None:
    """verl's global micro-batches (÷ workers: the per-GPU keys) and its sequence parallelism's size."""
    optional_positive_int(section, *global_keys)
    positive_int(section, "ulysses_sequence_parallel_size")


def _optimizer(optim: Any) -> None:
    positive(optim, "clip_grad")
    if optim.warmup_style is not None and optim.warmup_style != optim.lr_scheduler_type:
        raise ConfigError.invalid(
            "warmup_style",
            optim.warmup_style,
            f"contradicts lr_scheduler_type={optim.lr_scheduler_type} (its newer name)",
        )


def _fp32_masters(arr: Any) -> None:
    """A LoRA actor trains fp32 adapters over a frozen base, which verl's model_dtype may hold in bf16 (it is the
    compute dtype then, normalize); a fully trained actor keeps fp32 masters."""
    dtype = arr.actor.fsdp_config.model_dtype
    if dtype not in ("fp32", "float32") and arr.model.lora_rank == 0:
        raise ConfigError.invalid(
            "actor.fsdp_config.model_dtype",
            dtype,
            "a trained role keeps fp32 master weights; fsdp_config.dtype (mixed_precision.param_dtype) sets "
            "the compute dtype",
        )


def _refused(section: Any, key: str, why: str) -> None:
    """A path that would change what is trained if ignored: refused unless null."""
    value = getattr(section, key)
    if value is not None:
        raise ConfigError.invalid(key, value, f"{why}; set it to null")


def _agent_loop(agent: Any) -> None:
    positive_int(agent, "num_workers")
    _refused(
        agent,
        "agent_loop_config_path",
        "custom agent loops are not in ColoRL (single_turn_agent and tool_agent are built in)",
    )


def _target(name: str) -> tuple[str, type, str]:
    """verl's ``_target_`` key: the class verl builds the section as (recorded, not used)."""
    return "_target_", str, name


VERL_ONLY: dict[type, Keys] = {
    core.PPOConfig: Keys(
        (
            ("global_profiler", trees.GlobalProfilerTree),
            ("transfer_queue", trees.TransferQueueTree),
            ("skip", trees.SkipTree),
            # the older spellings of reward.* (null: not set; normalize moves what is set into reward)
            ("custom_reward_function", legacy.LegacyCustomRewardFunctionConfig),
            ("reward_model", legacy.LegacyRewardModelConfig),
            ("sandbox_fusion", legacy.LegacySandboxFusionConfig),
        )
    ),
    machinery.RayInitConfig: Keys((("runtime_env", trees.RuntimeEnvTree),)),
    machinery.RayKwargsConfig: Keys((("timeline_json_file", str | None, None),)),
    core.DataConfig: Keys(
        (
            ("tokenizer", str | None, None),
            ("use_shm", bool, False),
            ("return_raw_input_ids", bool, False),
            ("return_full_prompt", bool, False),
            ("return_raw_chat", bool, True),  # ColoRL always keeps the untemplated prompt (non-tensor "raw_prompt")
            ("dataloader_num_workers", int, 8),
            ("image_patch_size", int, 14),
            ("validation_shuffle", bool, False),
            ("filter_overlong_prompts_workers", int, 1),
            ("image_key", str, "images"),
            ("video_key", str, "videos"),
            ("audio_key", str, "audios"),
            ("trust_remote_code", bool, False),
            ("custom_cls", trees.CustomClsTree),
            ("return_multi_modal_inputs", bool, True),
            ("mm_processor_kwargs", dict[str, Any], {}),
        )
    ),
    core.AlgorithmConfig: Keys(
        (_target("verl.trainer.config.AlgoConfig"), ("use_pf_ppo", bool, False), ("pf_ppo", trees.PFPPOTree))
    ),
    core.KLCtrlConfig: Keys((_target("verl.trainer.config.KLControlConfig"),)),
    core.FilterGroupsConfig: Keys(
        (_target("verl.trainer.config.FilterGroupsConfig"), ("max_inflight_gen_batches", int, 1)),
        lambda section: positive_int(section, "max_inflight_gen_batches"),
    ),
    core.TrainerConfig: Keys(
        (
            ("esi_redundant_time", float, 0),
            ("checkpoint_callback_class", str | None, None),
            ("del_local_ckpt_after_load", bool, False),
            ("ray_wait_register_center_timeout", int, 300),
            ("use_v1", bool, True),  # verl's trainer implementation switch: ColoRL has one (its v1 sync mode)
            ("default_hdfs_dir", str | None, None),  # verl's HDFS copy of checkpoints
            ("use_legacy_worker_impl", Literal["auto", "enable", "disable"], "auto"),
            ("v1", trees.TrainerV1Tree),  # the core's keys and verl's others
        )
    ),
    sections.ActorRolloutRefConfig: Keys(
        (("hybrid_engine", bool, True), ("nccl_timeout", int, 600)), lambda section: _fp32_masters(section)
    ),
    sections.ModelConfig: Keys(
        (
            _target("verl.workers.config.HFModelConfig"),
            ("hf_config_path", str | None, None),
            ("tokenizer_path", str | None, None),
            ("use_shm", bool, False),
            ("custom_chat_template", str | None, None),
            ("external_lib", str | None, None),
            ("enable_activation_offload", bool, False),
            ("exclude_modules", Any, None),
            ("lora_adapter_path", str | None, None),
            ("use_liger", bool, False),
            ("fused_kernel_options", trees.FusedKernelOptionsTree),
            ("tiled_mlp", trees.TiledMLPTree),
            ("mtp", trees.MtpTree),
            ("lora", trees.MegatronLoraTree),  # Megatron's LoRA; ColoRL's is lora_rank, lora_alpha, target_modules
        )
    ),
    sections.OptimConfig: Keys(
        (
            _target("verl.workers.config.FSDPOptimizerConfig"),
            ("total_training_steps", int, -1),  # verl injects it at run time
            ("clip_grad", float, 1.0),  # verl's engine key of the role's grad_clip (normalize makes them one)
            ("warmup_style", Literal["constant", "cosine"] | None, None),  # the older name of lr_scheduler_type
        ),
        lambda section: _optimizer(section),
    ),
    sections.FSDPConfig: Keys(
        (
            _target("verl.workers.config.FSDPEngineConfig"),
            ("offload_policy", bool, False),
            ("fsdp_size", int, -1),
            ("forward_prefetch", bool, False),
            ("model_dtype", str, "fp32"),  # the dtype verl loads weights (and keeps trained roles' masters) in
            ("use_orig_params", bool, False),
            ("seed", int, 42),
            ("full_determinism", bool, False),
            ("ulysses_sequence_parallel_size", int, 1),
            ("entropy_from_logits_with_chunking", bool, "${oc.select:..entropy_from_logits_with_chunking,false}"),
            ("entropy_from_logits_chunk_size", int, "${oc.select:..entropy_from_logits_chunk_size,2048}"),
            ("use_torch_compile", bool, True),
            ("entropy_checkpointing", bool, "${oc.select:..entropy_checkpointing,false}"),
            ("use_no_sync_for_gradient_accumulation", bool, False),
            ("pad_to_length", bool, "${oc.select:..pad_to_length,false}"),
            ("pad_to_length_bucket", int, 1024),
            ("forward_only", bool, False),
            ("strategy", Strategy, "fsdp"),
            ("dtype", str, "bfloat16"),  # the compute dtype (normalize sets mixed_precision.param_dtype from it)
            ("qat", trees.QATTree),
            ("turbo_config", trees.TurboTree),
        )
    ),
    sections.RefFSDPConfig: Keys(  # a forward-only engine's defaults
        (
            ("forward_only", bool, True),
            ("pad_to_length_bucket", int, "${oc.select:actor_rollout_ref.actor.fsdp_config.pad_to_length_bucket,1024}"),
        )
    ),
    sections.ActorConfig: Keys(
        (
            _target(ACTOR_TARGET),
            ("strategy", Strategy, "fsdp"),
            ("ppo_micro_batch_size", int | None, None),  # the global micro-batch: normalize divides it by workers
            ("freeze_vision_tower", bool, False),
            ("calculate_entropy", bool, False),
            ("use_torch_compile", bool, True),
            ("data_loader_seed", int, 42),
            ("checkpoint", trees.CheckpointTree),
            ("profiler", trees.ProfilerTree),
            ("qat", trees.ActorQATTree),
            ("ulysses_sequence_parallel_size", int, 1),
            ("entropy_from_logits_with_chunking", bool, False),
            ("entropy_from_logits_chunk_size", int, 2048),
            ("entropy_checkpointing", bool, False),
            ("pad_to_length", bool, False),
        ),
        lambda section: _micro_batches(section, "ppo_micro_batch_size"),
    ),
    sections.PolicyLossConfig: Keys((_target("verl.workers.config.PolicyLossConfig"),)),
    sections.RefConfig: Keys(
        (
            ("strategy", Strategy, "${actor_rollout_ref.actor.strategy}"),
            ("use_torch_compile", bool, "${actor_rollout_ref.actor.use_torch_compile}"),
            ("log_prob_micro_batch_size", int | None, None),
            ("profiler", trees.ProfilerTree),
            _target(ACTOR_TARGET),
            ("ulysses_sequence_parallel_size", int, "${actor_rollout_ref.actor.ulysses_sequence_parallel_size}"),
            ("entropy_from_logits_with_chunking", bool, False),
            ("entropy_from_logits_chunk_size", int, 2048),
            ("entropy_checkpointing", bool, False),
            ("pad_to_length", bool, "${actor_rollout_ref.actor.pad_to_length}"),
        ),
        lambda section: _micro_batches(section, "log_prob_micro_batch_size"),
    ),
    sections.CriticConfig: Keys(
        (
            _target("verl.workers.config.FSDPCriticConfig"),
            ("strategy", Strategy, "fsdp"),
            ("ppo_micro_batch_size", int | None, None),
            ("data_loader_seed", int, 42),
            ("checkpoint", trees.CriticCheckpointTree),
            ("profiler", trees.ProfilerTree),
            ("forward_micro_batch_size", int | None, "${critic.ppo_micro_batch_size}"),
            ("ulysses_sequence_parallel_size", int, 1),
        ),
        lambda section: _micro_batches(section, "ppo_micro_batch_size", "forward_micro_batch_size"),
    ),
    sections.RolloutConfig: Keys(
        (
            _target("verl.workers.config.RolloutConfig"),
            ("name", Literal["hf", "vllm", "sglang", "auto"], "hf"),  # sglang loads and warns (inert)
            ("mode", Literal["sync", "async"], "async"),  # either: each step's batch is generated before the update
            ("full_determinism", bool, False),
            ("seed", int, 42),
            ("dtype", str, "bfloat16"),
            ("ignore_eos", bool, False),
            ("cudagraph_capture_sizes", Any, None),
            ("data_parallel_size", int, 1),
            ("expert_parallel_size", int, 1),
            ("pipeline_model_parallel_size", int, 1),
            ("logprobs_mode", str | None, "processed_logprobs"),
            ("scheduling_policy", str, "fcfs"),
            ("log_prob_micro_batch_size", int | None, None),  # the global micro-batch: normalize divides it
            ("disable_log_stats", bool, True),
            ("over_sample_rate", float, 0),
            ("multi_stage_wake_up", bool, False),
            ("layered_summon", bool, False),  # vLLM takes the actor's weights one FSDP unit at a time anyway
            ("router_config_path", str | None, None),
            ("checkpoint_engine", servers.CheckpointEngineTree),
            ("trace", servers.TraceTree),
            ("skip_tokenizer_init", bool, True),
            ("enable_rollout_routing_replay", bool, False),
            ("moe_load_balance_metrics_interval", int, 0),
            ("profiler", trees.RolloutProfilerTree),
            ("prometheus", servers.PrometheusTree),
            ("quantization", str | None, None),
            ("quantization_config_file", str | None, None),
            ("mtp", Any, None),  # verl copies the model's mtp section here
            ("qat", Any, None),  # ... and the actor's fsdp_config.qat
            ("disaggregation", servers.DisaggregationTree),
            ("engine_kwargs", trees.EngineKwargsTree),  # vllm's and verl's other engines'
        ),
        lambda section: optional_positive_int(section, "log_prob_micro_batch_size"),
    ),
    sections.ValKwargs: Keys((_target("verl.workers.config.SamplingConfig"),)),
    sections.MultiTurnConfig: Keys(
        (
            _target("verl.workers.config.MultiTurnConfig"),
            ("interaction_config_path", str | None, None),  # a simulated user
            ("use_inference_chat_template", bool, False),  # false: later turns see the recorded token ids
            ("num_repeat_rollouts", int | None, None),
        ),
        lambda section: _refused(
            section, "interaction_config_path", "verl's simulated-user interactions are not in ColoRL"
        ),  # ignoring it would train without the simulated user
    ),
    sections.AgentLoopConfig: Keys(
        (
            _target("verl.workers.config.AgentLoopConfig"),
            ("num_workers", int, 8),  # verl's agent-loop processes; ColoRL runs the loop in each rollout worker
            ("agent_loop_config_path", str | None, None),  # custom agent-loop classes
            ("custom_async_server", servers.CustomAsyncServerTree),
        ),
        lambda section: _agent_loop(section),
    ),
    distillation.DistillationConfig: Keys(
        (
            _target("verl.workers.config.DistillationConfig"),
            ("n_gpus_per_node", int, 8),  # verl's teacher resource pool; ColoRL colocates the teacher
            ("nnodes", int, 0),
        )
    ),
    distillation.DistillationLossConfig: Keys(
        (
            _target("verl.workers.config.DistillationLossConfig"),
            ("policy_loss_mode", Literal["vanilla"], "vanilla"),  # verl supports only PPO's clipped loss here
        )
    ),
    distillation.TeacherModelConfig: Keys(
        (
            _target("verl.workers.config.DistillationTeacherModelConfig"),
            ("num_replicas", int, 0),  # verl's inference replicas; ColoRL's teacher is one more role on every worker
            ("inference", servers.TeacherInferenceConfig),
        )
    ),
    sections.RewardConfig: Keys(
        (_target("verl.workers.config.RewardConfig"), ("sandbox_fusion", servers.SandboxFusionConfig))
    ),
    reward.RewardManagerConfig: Keys((_target("verl.workers.config.reward.RewardManagerConfig"),)),
    reward.ModuleConfig: Keys((_target("verl.trainer.config.config.ModuleConfig"),)),
    sections.RewardModelConfig: Keys(
        (
            _target("verl.workers.config.RewardModelConfig"),
            ("enable_resource_pool", bool, False),
            ("n_gpus_per_node", int, 8),
            ("nnodes", int, 0),
            ("rollout", servers.RewardRolloutTree),  # verl serves its reward model; ColoRL's is an FSDP role
        )
    ),
}
