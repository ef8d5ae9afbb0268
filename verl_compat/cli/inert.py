"""verl's keys of machinery ColoRL does not have: what ColoRL does instead, one line each.

Every key of verl's configuration loads (``config.schema``). Those ColoRL cannot honour are listed in ``INERT``
(glob patterns over the dotted key, first match wins): a value other than the default, and other than the
``quiet`` values ColoRL honours as they are, warns once, naming what ColoRL does instead
(``inert_warnings``: printed when the trainer is built and by ``trainer.dry_run=true``). A key whose ignoring
would change the results is ``refuse``d instead, in one line, when the config is built (``check_refused``).
A new machinery's keys (an inference engine's, say) are one edit of this table.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from config.checks import ConfigError, show
from config.distillation import active_teachers
from config.tree import flat
from verl_compat.cli.schema import VerlPPOConfig
from verl_compat.cli.servers import TeacherInferenceConfig

ARR, RO = "actor_rollout_ref", "actor_rollout_ref.rollout"
FSDP = ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp",
        "reward.reward_model.fsdp_config")  # fmt: skip
MODELS = ("actor_rollout_ref.model", "critic.model")
TRAINED = ("actor_rollout_ref.actor", "critic")
QUIET = ()  # the default only


@dataclass(frozen=True)
class Inert:
    """``instead``: what ColoRL does; ``quiet``: values it honours as they are (no warning); ``refuse``: a value
    other than the default and ``quiet`` ones changes the results, so it is an error; ``never``: no warning at all
    (verl fills the key itself); ``engine``: the ``rollout.name`` whose engine honours the key (no warning then);
    ``modes``: the ``trainer.v1.trainer_mode``s that honour it (no warning then)."""

    instead: str
    quiet: tuple = QUIET
    refuse: bool = False
    never: bool = False
    engine: str | None = None
    modes: tuple[str, ...] = ()


def _each(sections: tuple[str, ...], suffix: str, entry: Inert) -> dict[str, Inert]:
    return {f"{section}.{suffix}": entry for section in sections}


SILENT = Inert("verl fills it from other keys", never=True)
ENGINE = "ColoRL generates with the actor's own FSDP model (rollout.name=hf) or a vLLM engine beside it (vllm)"
# the rollout keys the vLLM engine of rollout.name=vllm reads (workers.compute.vllm_rollout); layered_summon: it
# always takes the actor's weights one FSDP unit at a time
VLLM_KEYS = (
    "tensor_model_parallel_size",
    "gpu_memory_utilization",
    "enforce_eager",
    "free_cache_engine",
    "max_num_batched_tokens",
    "max_model_len",
    "max_num_seqs",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "load_format",
    "layered_summon",
    "engine_kwargs.vllm.*",
)
INERT: dict[str, Inert] = {
    # verl copies these from other keys: the model's mtp, the actor's qat, the trainer's and the model's names
    f"{RO}.mtp*": SILENT,
    f"{RO}.qat*": SILENT,
    f"{RO}.trace.project_name": SILENT,
    f"{RO}.trace.experiment_name": SILENT,
    f"{RO}.prometheus.served_model_name": SILENT,
    # ------------------------------------------------------------ changes the results: refused
    **_each(FSDP, "qat.enable", Inert("quantisation-aware training is not in ColoRL", refuse=True)),
    f"{ARR}.actor.qat.enable": Inert("quantisation-aware training is not in ColoRL", refuse=True),
    **_each(MODELS, "mtp.enable*", Inert("multi-token prediction is not in ColoRL", refuse=True)),
    **_each(
        TRAINED,
        "checkpoint.load_contents",
        Inert("ColoRL resumes the whole state (model, optimizer, data position)", refuse=True),
    ),
    f"{ARR}.actor.fsdp_config.model_dtype": Inert("", never=True),  # config.sections: refused unless LoRA
    "critic.fsdp.model_dtype": Inert(
        "a trained role keeps fp32 master weights; critic.fsdp.dtype sets the compute dtype",
        quiet=("fp32", "float32"),
        refuse=True,
    ),
    f"{RO}.ignore_eos": Inert("ColoRL's rollout ends a response at its EOS token", refuse=True),
    f"{RO}.quantization*": Inert("the rollout computes with the actor's weights as trained", refuse=True),
    f"{RO}.over_sample_rate": Inert("every sampled response is kept for the update", refuse=True),
    f"{RO}.logprobs_mode": Inert("the rollout's log-probs are temperature-scaled (processed_logprobs)", refuse=True),
    f"{RO}.agent.custom_async_server.path": Inert("the agent loop runs in ColoRL's rollout workers", refuse=True),
    "algorithm.use_pf_ppo": Inert("verl's policy-filtered PPO reweighting is not in ColoRL", refuse=True),
    "data.custom_cls.path": Inert("ColoRL's dataset is data.dataset.RLHFDataset", refuse=True),
    "data.tokenizer": Inert("the dataset uses the policy's tokenizer", refuse=True),
    "reward.sandbox_fusion.url": Inert("ColoRL has no code-execution sandbox for rewards", refuse=True),
    **_each(MODELS, "custom_chat_template", Inert("the tokenizer's own chat template is used", refuse=True)),
    **_each(MODELS, "external_lib", Inert("models load with transformers' Auto classes", refuse=True)),
    **_each(MODELS, "hf_config_path", Inert("the model's config is read from model.path", refuse=True)),
    **_each(MODELS, "tokenizer_path", Inert("the tokenizer is read from actor_rollout_ref.model.path", refuse=True)),
    **_each(MODELS, "lora_adapter_path", Inert("LoRA adapters start fresh (model.lora_rank)", refuse=True)),
    **_each(MODELS, "exclude_modules", Inert("LoRA adapts model.target_modules", refuse=True)),
    "critic.model.lora_rank": Inert("the critic is fully fine-tuned", refuse=True),
    # ------------------------------------------------------------ verl fills these itself
    "*._target_": Inert("ColoRL builds its own classes; verl's class names are recorded, not used"),
    "*.optim.total_training_steps": SILENT,
    "algorithm.pf_ppo.*": SILENT,
    # ------------------------------------------------------------ machinery ColoRL does not have: a warning
    "*profiler.*": Inert(
        "ColoRL has no profiler hooks: each step prints one timed line per phase (py-spy, benchmarks/)"
    ),
    **_each(FSDP, "offload_policy", Inert("fsdp_config.param_offload moves the weights to the CPU between phases")),
    **_each(FSDP, "forward_prefetch", Inert("FSDP2 prefetches as it does by default")),
    **_each(FSDP, "use_orig_params", Inert("FSDP2 keeps the original parameters")),
    **_each(FSDP, "seed", Inert("weights load from the checkpoint; trainer.seed seeds the rest")),
    **_each(FSDP, "full_determinism", Inert("trainer.deterministic=true makes runs repeatable")),
    **_each(FSDP, "ulysses_sequence_parallel_size", Inert("each worker runs whole sequences")),
    **_each(FSDP, "entropy_*", Inert("model.use_fused_kernels computes the entropy in chunks of tokens")),
    **_each(FSDP, "use_torch_compile", Inert("", never=True)),
    **_each(FSDP, "use_no_sync_for_gradient_accumulation", Inert("gradients reduce as FSDP2 does by default")),
    **_each(FSDP, "pad_to_length*", Inert("packed micro-batches keep the length they have")),
    **_each(FSDP, "forward_only", Inert("ColoRL knows which roles are trained", never=True)),
    **_each(FSDP, "strategy", Inert("ColoRL shards with FSDP2", quiet=("fsdp", "fsdp2"))),
    **_each(FSDP, "turbo_config.*", Inert("torchtitan's sharding plan is not in ColoRL")),
    **_each(FSDP, "fsdp_size", Inert("FSDP shards each model over all workers")),
    f"{ARR}.ref.fsdp_config.model_dtype": Inert("a frozen role's weights are held in its compute dtype"),
    "reward.reward_model.fsdp_config.model_dtype": Inert("a frozen role's weights are held in its compute dtype"),
    **_each(TRAINED, "data_loader_seed", Inert("mini-batches are shuffled with trainer.seed")),
    **_each(
        TRAINED,
        "checkpoint.*",
        Inert("ColoRL saves model, optimizer and extra state; trainer/export.py writes a Hugging Face model"),
    ),  # fmt: skip
    **_each(TRAINED + (f"{ARR}.ref",), "ulysses_sequence_parallel_size", Inert("each worker runs whole sequences")),
    **{
        f"{section}.{key}": Inert("model.use_fused_kernels computes entropy in chunks")
        for section in TRAINED[:1] + (f"{ARR}.ref",)
        for key in ("entropy_from_logits_*", "entropy_checkpointing")  # not entropy_coeff: the loss reads it
    },
    **_each(TRAINED[:1] + (f"{ARR}.ref",), "pad_to_length", Inert("packed micro-batches keep their length")),
    f"{ARR}.actor.freeze_vision_tower": Inert("ColoRL trains text models"),
    f"{ARR}.actor.calculate_entropy": Inert("actor/entropy is reported at every update", never=True),
    f"{ARR}.actor.use_torch_compile": Inert(
        "its eager log-prob and entropy code; actor.compile_model compiles the whole policy", quiet=(False,)
    ),  # fmt: skip
    f"{ARR}.ref.use_torch_compile": Inert("the reference's forward runs eagerly", quiet=(False,)),
    f"{RO}.name": Inert(ENGINE, quiet=("hf", "vllm")),
    **{
        f"{RO}.{key}": Inert("the rollout runs on the training workers", modes=("separate_async",))
        for key in ("nnodes", "n_gpus_per_node")
    },
    f"{RO}.tensor_model_parallel_size": Inert(
        "the rollout runs on each worker's gathered actor model", quiet=(1,), engine="vllm"
    ),
    **{
        f"{RO}.{key}": Inert(instead, engine="vllm" if key in VLLM_KEYS else None)
        for key, instead in {
            "full_determinism": "trainer.deterministic=true makes runs repeatable",
            "seed": "sampling is seeded from trainer.seed",
            "dtype": "the rollout computes in the actor's dtype (fsdp_config.mixed_precision)",
            "gpu_memory_utilization": "no inference engine reserves memory; the KV cache is allocated per batch",
            "enforce_eager": "decoding is eager unless actor.compile_model=true",
            "cudagraph_capture_sizes": "decoding is eager unless actor.compile_model=true",
            "free_cache_engine": "the KV cache is freed after every generation",
            "data_parallel_size": "every worker generates its share of the batch",
            "expert_parallel_size": "every worker generates with its gathered actor model",
            "pipeline_model_parallel_size": "every worker generates with its gathered actor model",
            "max_num_batched_tokens": "each worker decodes its whole share of the batch",
            "max_model_len": "sequences are data.max_prompt_length + max_response_length",
            "max_num_seqs": "each worker decodes its whole share of the batch",
            "enable_chunked_prefill": "each prompt batch is prefilled in one forward",
            "enable_prefix_caching": "each prompt batch is prefilled in one forward",
            "scheduling_policy": "each worker decodes its whole share of the batch",
            "load_format": "the rollout computes with the actor's weights in place",
            "layered_summon": "the actor's FSDP groups are gathered once per generation",
            "multi_stage_wake_up": "the rollout computes with the actor's weights in place",
            "engine_kwargs.vllm.*": "vLLM's engine arguments, read by rollout.name=vllm",
            "engine_kwargs.*": ENGINE,
            "router_config_path": ENGINE,
            "checkpoint_engine.*": "the rollout computes with the actor's weights in place",
            "trace.*": "rollout tracing is not in ColoRL",
            "enable_rollout_routing_replay": "MoE routing is not replayed",
            "moe_load_balance_metrics_interval": "MoE load-balance metrics are not in ColoRL",
            "prometheus.*": "ColoRL exports no Prometheus metrics",
            "disaggregation.*": ENGINE,
            "multi_turn.use_inference_chat_template": "later turns continue from the recorded token ids of the "
            "earlier ones",
            "multi_turn.num_repeat_rollouts": "each row is rolled out once; rollout.n repeats the prompts",
            "agent.num_workers": "each rollout worker runs the agent loop for its rows",
            "agent.custom_async_server.*": "the agent loop runs in ColoRL's rollout workers",
        }.items()
    },
    f"{RO}.disable_log_stats": Inert("", never=True),
    f"{RO}.skip_tokenizer_init": Inert("", never=True),
    **_each(MODELS, "use_shm", Inert("the model is read from its directory")),
    **_each(MODELS, "enable_activation_offload", Inert("model.enable_gradient_checkpointing recomputes activations")),
    **_each(MODELS, "use_liger", Inert("model.use_fused_kernels computes log-probs without the full logits")),
    **_each(MODELS, "fused_kernel_options.*", Inert("model.use_fused_kernels: ColoRL's chunked kernels")),
    **_each(MODELS, "tiled_mlp.*", Inert("the MLP runs whole")),
    **_each(MODELS, "lora.*", Inert("Megatron's LoRA; ColoRL's is model.lora_rank, lora_alpha, target_modules")),
    f"{ARR}.hybrid_engine": Inert("the roles always share one process per device"),
    f"{ARR}.nccl_timeout": Inert("trainer.phase_timeout_s bounds each phase"),
    **{
        f"data.{key}": Inert(instead)
        for key, instead in {
            "use_shm": "the data files are read where they are",
            "return_raw_input_ids": "the prompts are tokenized once, with the policy's tokenizer",
            "return_full_prompt": "the untemplated prompt is kept (raw_prompt)",
            "image_patch_size": "ColoRL trains text models",
            "validation_shuffle": "validation reads its files in order",
            "image_key": "ColoRL trains text models",
            "video_key": "ColoRL trains text models",
            "audio_key": "ColoRL trains text models",
            "trust_remote_code": "the tokenizer loads with actor_rollout_ref.model.trust_remote_code",
            "return_multi_modal_inputs": "ColoRL trains text models",
            "mm_processor_kwargs.*": "ColoRL trains text models",
            "custom_cls.name": "ColoRL's dataset is data.dataset.RLHFDataset",
        }.items()
    },
    "data.dataloader_num_workers": Inert("", never=True),
    "data.filter_overlong_prompts_workers": Inert("", never=True),
    "reward.num_workers": Inert("read by the remote reward manager only", never=True),
    "reward.reward_model.enable_resource_pool": Inert("the reward model is colocated with the other roles"),
    "reward.reward_model.n_gpus_per_node": Inert("the reward model is colocated with the other roles"),
    "reward.reward_model.nnodes": Inert("the reward model is colocated with the other roles"),
    "reward.reward_model.rollout.*": Inert(
        "the reward model runs as an FSDP role (reward.reward_model.micro_batch_size_per_gpu, fsdp_config)"
    ),  # fmt: skip
    "reward.sandbox_fusion.*": Inert("", never=True),
    "reward_model.model.external_lib": Inert("models load with transformers' Auto classes", refuse=True),
    "reward_model.*": Inert("moved into reward.* (verl_compat.cli.normalize)", never=True),
    "custom_reward_function.*": Inert("moved into reward.* (verl_compat.cli.normalize)", never=True),
    "sandbox_fusion.*": Inert("moved into reward.* (verl_compat.cli.normalize)", never=True),
    "trainer.esi_redundant_time": Inert("ColoRL saves on SIGTERM/SIGINT and at trainer.max_wall_time_s"),
    "trainer.checkpoint_callback_class": Inert("no callback runs after a checkpoint is saved"),
    "trainer.del_local_ckpt_after_load": Inert("checkpoints are kept (trainer.max_actor_ckpt_to_keep prunes)"),
    "trainer.ray_wait_register_center_timeout": Inert("trainer.phase_timeout_s bounds each phase"),
    "trainer.use_v1": Inert("ColoRL has one trainer (verl's v1 sync mode)", never=True),
    # trainer.v1.trainer_mode and its keys: planner.trainer_modes
    "trainer.v1.separate_async.hybrid_rollout.*": Inert("the trainer's workers never generate for the rollout group"),
    "trainer.v1.separate_async.*": Inert("read by trainer.v1.trainer_mode=separate_async", modes=("separate_async",)),
    "trainer.v1.colocate_async.*": Inert("read by trainer.v1.trainer_mode=colocate_async", modes=("colocate_async",)),
    "trainer.v1.sampler.max_off_policy_*": Inert(
        "a synchronous step trains on its own samples", modes=("colocate_async", "separate_async")
    ),  # fmt: skip
    "trainer.v1.sampler.sync_refill_failed_groups": Inert(
        "no group fails in ColoRL's rollout: a failing tool or reward function ends one trajectory with its score"
    ),  # fmt: skip
    "trainer.v1.sampler.*": Inert(
        "ColoRL's replay buffer is trainer.asynchronous.replay_buffer (in-order, whole batches)"
    ),
    "trainer.default_hdfs_dir": Inert("checkpoints stay in trainer.default_local_dir"),
    "trainer.use_legacy_worker_impl": Inert("ColoRL has one worker implementation"),
    "ray_kwargs.ray_init.runtime_env.*": Inert("workers inherit the driver's environment"),
    "ray_kwargs.timeline_json_file": Inert("Ray's timeline is not written"),
    "algorithm.filter_groups.max_inflight_gen_batches": Inert("dynamic sampling generates one batch at a time"),
    "transfer_queue.*": Inert("each worker keeps its rows' tensors for the step (workers/compute/step_store.py)"),
    "skip.*": Inert("every step generates its rollouts"),
}


@cache
def _compiled() -> list[tuple[re.Pattern, Inert]]:
    return [(re.compile(fnmatch.translate(pattern)), found) for pattern, found in INERT.items()]


@cache
def entry(key: str) -> Inert | None:
    """The table's entry for dotted ``key`` (first matching pattern), or None: ColoRL honours the key."""
    return next((found for pattern, found in _compiled() if pattern.match(key)), None)


@cache
def _written_defaults() -> dict[str, Any]:
    """Each key's default as the schema writes it (``${...}`` where it follows another key)."""
    return dict(flat(VerlPPOConfig()))


def _set(cfg: Any) -> Iterator[tuple[str, Any, Any, Inert]]:
    """(key, value, default, entry) of each listed key whose value is neither its default nor a quiet one. A key
    whose default follows another key (``${trainer.n_gpus_per_node}``) is compared with that key's value."""
    written, values = _written_defaults(), dict(flat(cfg))
    for key, value in values.items():
        found = entry(key)
        if found is None or found.never or (found.engine and found.engine == values.get(f"{RO}.name")):
            continue
        if values.get("trainer.v1.trainer_mode") in found.modes:
            continue
        default = reference = written.get(key)
        if isinstance(reference, str) and reference.startswith("${"):
            if not re.fullmatch(r"\$\{[\w.]+\}", reference):
                continue  # verl's relative defaults (oc.select) follow the role's own key, which is checked
            default = values.get(reference[2:-1])
        if value != default and value not in found.quiet:
            yield key, value, default, found


def check_refused(cfg: Any) -> None:
    """ConfigError for the first listed key whose value would change the results ColoRL computes."""
    for key, value, default, found in _set(cfg):
        if found.refuse:
            raise ConfigError(f"{key}={show(value)}: {found.instead}; set {key}={show(default)}")


def inert_warnings(cfg: Any) -> list[str]:
    """One line per listed key set to a value ColoRL does not honour, naming what it does instead; then those of
    the distillation teachers' server and pool keys (``teacher_warnings``)."""
    return [
        f"{key}={show(value)}: {found.instead or 'not used by ColoRL'}; set {key}={show(default)} to silence this"
        for key, value, default, found in _set(cfg)
        if not found.refuse
    ] + teacher_warnings(cfg.distillation)


def teacher_warnings(config: Any) -> list[str]:
    """One line per key of a distillation teacher's own server or pool (``distillation.*``) set away from its
    default: accepted, unused, worded as ``INERT``'s lines."""
    if not config.enabled:
        return []
    colocated = "ColoRL's teacher is a frozen FSDP role on every worker, beside the actor"
    defaults = type(config)()
    found = [
        (f"distillation.{key}", getattr(config, key), getattr(defaults, key), "it has no pool of its own")
        for key in ("n_gpus_per_node", "nnodes")
    ]
    for name, teacher in active_teachers(config).items():
        prefix = f"distillation.teacher_models.{name}"
        found.append((f"{prefix}.num_replicas", teacher.num_replicas, 0, "it is no inference server"))
        found += [
            (
                f"{prefix}.inference.{f.name}",
                getattr(teacher.inference, f.name),
                getattr(TeacherInferenceConfig(), f.name),
                "not an inference server",
            )
            for f in dataclasses.fields(TeacherInferenceConfig)
        ]
    return [
        f"{key}={show(value)}: {colocated}, {why}; set {key}={show(default)} to silence this"
        for key, value, default, why in found
        if value != default
    ]
