"""Know a run before it runs: ``trainer.dry_run=true`` prints a step's batch arithmetic and each worker's memory
estimate, and every run checks before any model loads that the estimate fits the device (``trainer.check_memory``).

Both come from the typed config, the step plan and the models' configs (``config.json``, or the built-in demo's
config; the models are built on the meta device, so no weights are read): no Ray, no data loading, seconds.
The memory model is ``trainer.preflight.memory_estimate``'s; its phases ``trainer.preflight.memory_phases``';
whether it fits the device ``trainer.preflight.memory_check``'s.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from config import ConfigError, PPOConfig, engine
from config.adapter import installed
from config.tree import ARR
from planner import StepPlan
from planner.batching import PHASE_BATCHES
from planner.phases import STEP_PHASES, Step
from planner.plan import rollout_plan
from planner.worker_roles import ACTOR, ROLES, TEACHER
from trainer.preflight.memory_check import check_memory, verdict
from trainer.preflight.memory_estimate import TERMS, GiB, MemoryEstimate, ModelSizes, model_sizes
from trainer.preflight.memory_phases import estimate_memory
from trainer.preflight.phase_code import phase_lines
from trainer.preflight.teacher_checks import check_teachers
from trainer.running.dynamic_sampling import dynamic_sampling_lines


@dataclass(frozen=True)
class PhaseBatch:
    """One phase's batch on one worker: ``micro`` rows per forward, ``grad_accum`` micro-batches per optimizer step
    (None for a forward-only phase), ``optimizer_steps`` per training step, ``tokens`` through the model a step."""

    name: str
    rows: int
    micro: int
    micro_batches: int
    grad_accum: int | None
    optimizer_steps: int
    tokens: int


def phase_batches(cfg: PPOConfig, plan: StepPlan) -> list[PhaseBatch]:
    """The batch arithmetic of every worker phase a step runs (``planner.phases.STEP_PHASES``, each by its
    ``planner.batching.PHASE_BATCHES`` entry), at the longest sequences the config allows."""
    rows = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n // plan.n_workers
    length = cfg.data.max_prompt_length + cfg.data.max_response_length
    out = []
    for phase in STEP_PHASES:
        b = PHASE_BATCHES.get(phase.name)
        if b is None or not plan.runs(phase.name):
            continue
        if b.section is None:  # every row at once (a generation batch's, with dynamic sampling)
            at_once = getattr(plan, b.rows)
            out.append(PhaseBatch(phase.name, at_once, at_once, 1, None, 0, at_once * length))
            continue
        section = b.config(cfg)
        budget = getattr(section, b.budget) if b.is_dynamic(section) else None
        if b.mini is None:  # a forward per micro-batch
            size = min(max(1, budget // length) if budget else getattr(section, b.micro) or rows, rows)
            out.append(PhaseBatch(phase.name, rows, size, math.ceil(rows / size), None, 0, rows * length))
            continue
        mini = getattr(plan, b.mini)  # an update: micro-batches of each mini-batch, ppo_epochs times
        micro = min(max(1, budget // length) if budget else getattr(section, b.micro), mini)
        accum, steps = math.ceil(mini / micro), rows // mini * section.ppo_epochs
        out.append(PhaseBatch(phase.name, rows, micro, steps * accum, accum, steps, rows * length * section.ppo_epochs))
    return out


def prompt_count(cfg: PPOConfig, split: str) -> int | None:
    """Prompts in the train or val files (row counts; parquet from its footer), capped by ``*_max_samples``;
    the built-in task's size when the files are null; None when a file cannot be read."""
    data = cfg.data
    files = getattr(data, f"{split}_files")
    if files is None:
        count = cfg.builtin.num_train if split == "train" else cfg.builtin.num_val
    else:
        counts = [_rows(path) for path in ([files] if isinstance(files, str) else files)]
        if None in counts:
            return None
        count = sum(counts)
    cap = getattr(data, f"{split}_max_samples")
    return min(count, cap) if cap > 0 else count


def _rows(path: str) -> int | None:
    if not os.path.isfile(path):
        return None
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_metadata(path).num_rows
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def requested_device(cfg: PPOConfig) -> str:
    """trainer.device as a run would resolve it, without failing when CUDA is asked for and absent."""
    device = cfg.trainer.device
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def check_models(cfg: PPOConfig, plan: StepPlan) -> None:
    """Each model path the user set (null ones are the built-in demo's) names a model of the right kind: every role
    the plan places (``planner.worker_roles.ROLES``) with a model of its own, other than the actor's."""
    step, actor_path = Step(cfg, plan), cfg.actor_rollout_ref.model.path
    for role in ROLES:
        if role.instances:  # distillation's teachers: check_teachers, below
            continue
        path = role.model_path(cfg)
        own = role is ACTOR or path != actor_path
        if role.held(step) and role.shares is None and path is not None and own:
            trust = bool(getattr(role.model_config(cfg), "trust_remote_code", False))
            _check_model(role.path, path, trust, causal_lm=not role.value_head)
    check_teachers(cfg, _check_model)  # distillation: causal LMs with the student's vocabulary


def _check_model(key: str, path: str, trust_remote_code: bool, causal_lm: bool) -> None:
    """Fail before Ray starts when ``path`` is not a model directory (or, for the actor or a teacher, not a causal
    LM)."""
    if not os.path.isdir(path) and (os.path.isabs(path) or path.startswith(".") or path.count("/") != 1):
        raise ConfigError.invalid(
            key,
            path,
            "no such directory; expected a Hugging Face model directory "
            "(config.json, weights, tokenizer) or null for the built-in demo model",
        )
    config = _config(key, path, trust_remote_code)
    auto_map = getattr(config, "auto_map", None) or {}
    is_causal_lm = config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or "AutoModelForCausalLM" in auto_map
    if causal_lm and not is_causal_lm:
        raise ConfigError.invalid(
            key,
            path,
            f"a {config.model_type!r} model is not a causal LM; the "
            f"{TEACHER.name if key.startswith(TEACHER.path) else 'policy'} needs one that AutoModelForCausalLM loads "
            "(e.g. llama, qwen2, mistral, gpt2)",
        )


def load_model_sizes(cfg: PPOConfig, plan: StepPlan, demo_config: Callable[[], Any]) -> dict[str, ModelSizes]:
    """The sizes of each role's own model (``planner.worker_roles.ROLES`` that the plan places), from its
    ``config.json``; ``demo_config()`` gives the built-in model's config when ``actor_rollout_ref.model.path`` is null,
    and a null path of another role is the actor's model."""
    arr, step = cfg.actor_rollout_ref, Step(cfg, plan)
    actor_path = arr.model.path
    actor_config = (
        demo_config() if actor_path is None else _config(f"{ARR}.model.path", actor_path, arr.model.trust_remote_code)
    )
    sizes = {}
    for role in ROLES:
        if not role.held(step) or role.shares is not None:
            continue
        model = role.model_config(cfg)
        trust = bool(getattr(model, "trust_remote_code", False))
        min_params = role.fsdp(cfg).wrap_policy.min_num_params
        for name, (key, path) in role.paths(cfg).items():  # one model, or each of distillation's teachers
            config = actor_config if path in (None, actor_path) else _config(key, path, trust)
            sizes[name] = model_sizes(config, model if role.adapters else None, min_params, role.value_head)
    return sizes


def _config(key: str, path: str, trust_remote_code: bool) -> Any:
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ConfigError.invalid(key, path, f"no model config there ({str(exc).splitlines()[0]})") from None


def dry_run(cfg: PPOConfig, plan: StepPlan) -> int:
    """``python main.py ... trainer.dry_run=true``: check the models, print the report; the exit status. Imports
    neither Ray nor the data pipeline nor the trainer, so it takes seconds (docs/benchmarks.md, "Memory estimate")."""
    from data.builtin import demo_model_config  # the built-in model's config, for a null model path

    check_models(cfg, plan)
    print(report(cfg, plan, *_estimate(cfg, plan, functools.partial(demo_model_config, cfg.builtin))))
    return 0


def preflight(cfg: PPOConfig, plan: StepPlan, demo_config: Callable[[], Any]) -> None:
    """Before any model loads: with ``trainer.dry_run`` print the report and exit; else, with
    ``trainer.check_memory``, refuse a run whose estimated peak memory does not fit (``check_memory``)."""
    trainer = cfg.trainer
    if trainer.dry_run:  # the caller checked the models (build_trainer), as dry_run does
        print(report(cfg, plan, *_estimate(cfg, plan, demo_config)))
        sys.exit(0)
    if not trainer.check_memory or (requested_device(cfg) == "cuda" and not torch.cuda.is_available()):
        return  # a missing GPU is resolve_device's error to report
    _, estimate = _estimate(cfg, plan, demo_config)  # a mistake found building the models (LoRA targets) is said here
    check_memory(cfg, estimate)


def _estimate(
    cfg: PPOConfig, plan: StepPlan, demo_config: Callable[[], Any]
) -> tuple[dict[str, ModelSizes], MemoryEstimate]:
    """The models' sizes and the memory estimate per worker on the requested device."""
    models = load_model_sizes(cfg, plan, demo_config)
    return models, estimate_memory(cfg, plan, models, requested_device(cfg), val_rows=validation_rows(cfg, plan))


def validation_rows(cfg: PPOConfig, plan: StepPlan) -> int:
    """Rows a worker generates at once in validation (a val batch, or the whole set: its share, × val n); 0
    without validation data or when its size cannot be read."""
    if cfg.data.val_files is None and cfg.data.train_files is not None:  # the demo brings its own
        return 0
    batch = cfg.data.val_batch_size or prompt_count(cfg, "val") or 0
    return math.ceil(batch / plan.n_workers) * cfg.actor_rollout_ref.rollout.val_kwargs.n


def training_steps(cfg: PPOConfig) -> tuple[int | None, float | None, int | None]:
    """(total steps, epochs they make, prompts per epoch) as the trainer counts them; None where the data's size
    is unknown (a file missing)."""
    prompts = prompt_count(cfg, "train")
    batch = cfg.data.gen_batch_size or cfg.data.train_batch_size  # the dataloader's batches
    per_epoch = (
        None if prompts is None else (prompts // batch if cfg.data.dataloader_drop_last else math.ceil(prompts / batch))
    )
    total = cfg.trainer.total_training_steps or (None if per_epoch is None else per_epoch * cfg.trainer.total_epochs)
    epochs = None if total is None or not per_epoch else total / per_epoch
    return total, epochs, prompts


DECODE_STEPS = {  # config.engine.mode_for's modes, as the dry run names them
    "compiled": "the own step, compiled per batch bucket",
    "eager": "the own step, eager per batch bucket",
    "hf": "the HF loop",
}


def rollout_engine_line(rollout: Any, device: str) -> str:
    """Which engine generates, and (for the HF engine) which decode step on ``device``: ColoRL's own per batch
    bucket, compiled or eager, or the HF loop (``workers.compute.decode.resolve``; a model the own step does not
    read takes the HF loop)."""
    if rollout.name != "hf":
        return f"rollout: {rollout.name} (rollout.name)"
    setting = str(rollout.compile_decode).lower()
    step = DECODE_STEPS[engine.mode_for(rollout.compile_decode, device)]
    return f"rollout: hf (rollout.name), decode step: {step} (rollout.compile_decode={setting})"


def report(cfg: PPOConfig, plan: StepPlan, models: dict[str, ModelSizes], estimate: MemoryEstimate) -> str:
    """The dry run's text: models, steps, each phase's batch arithmetic and memory per worker."""
    data, arr, trainer = cfg.data, cfg.actor_rollout_ref, cfg.trainer
    total, epochs, prompts = training_steps(cfg)
    rows = data.train_batch_size * arr.rollout.n // plan.n_workers
    lines = [
        f"colorl dry run: {plan.n_workers} worker(s) on {estimate.device} (trainer.n_gpus_per_node="
        f"{trainer.n_gpus_per_node} × trainer.nnodes={trainer.nnodes}); no Ray, no weights loaded"
    ]
    for role, m in models.items():
        lines.append(
            f"  {role}: {m.params / 1e6:,.2f} M parameters ({m.trained / 1e6:,.2f} M trained), {m.layers} "
            f"layers, hidden {m.hidden}, vocabulary {m.vocab}"
        )
    steps = "unknown (the training files cannot be read)" if total is None else f"{total}"
    if epochs is not None:
        key = "data.gen_batch_size" if cfg.data.gen_batch_size else "data.train_batch_size"
        steps += f" = {epochs:.2f} epochs of {total / epochs:.0f} steps ({prompts} prompts / {key})"
    lines += [
        f"training steps: {steps}",
        f"a step: {data.train_batch_size} prompts × {arr.rollout.n} responses = "
        f"{data.train_batch_size * arr.rollout.n} sequences, {rows} per worker, each up to "
        f"{data.max_prompt_length} + {data.max_response_length} tokens",
        rollout_engine_line(arr.rollout, estimate.device),
        *dynamic_sampling_lines(cfg, plan),
        *rollout_group_lines(cfg, plan, models, estimate.device),
        "",
        "batch per worker and step   rows  micro-batch  micro-batches  grad. accum.  optimizer steps   tokens",
    ]
    for b in phase_batches(cfg, plan):
        accum = "-" if b.grad_accum is None else str(b.grad_accum)
        lines.append(
            f"  {b.name:24s}{b.rows:6d}{b.micro:13d}{b.micro_batches:15d}{accum:>14s}"
            f"{b.optimizer_steps or '-':>17}{b.tokens:9d}"
        )
    lines += [
        "",
        "memory per worker, GiB (at the longest sequences; activations with gradient checkpointing as "
        "configured | switched)",
        "  phase         " + "".join(f"{t:>{_width(t)}s}" for t in TERMS) + "       total",
    ]
    for phase in estimate.phases:
        cells = [f"{phase.terms.get(t, 0) / GiB:{_width(t)}.3f}" for t in TERMS]
        if phase.activations_other is not None:
            both = f"{phase.terms['activations'] / GiB:.3f}|{phase.activations_other / GiB:.3f}"
            cells[TERMS.index("activations")] = f"{both:>{_width('activations')}s}"
        lines.append(f"  {phase.name:14s}" + "".join(cells) + f"{phase.total / GiB:12.3f}")
    lines.append(verdict(cfg, estimate))
    lines += ["", *phase_lines(plan)]
    inert = installed().warnings(cfg)  # keys set here that nothing honours (config.adapter)
    lines += [
        "",
        "config keys set that ColoRL does not use:" if inert else "config keys set that ColoRL does not use: none",
    ]
    lines += [f"  {line}" for line in inert]
    return "\n".join(lines)


def rollout_group_lines(cfg: PPOConfig, plan: StepPlan, models: dict[str, ModelSizes], device: str) -> list[str]:
    """``separate_async``: the rollout group's workers, batch arithmetic and memory (its actor and generation)."""
    if not plan.mode.separate:
        return []
    on_rollout = rollout_plan(cfg, plan)
    gen = next(p for p in estimate_memory(cfg, on_rollout, models, device).phases if p.name == "gen")
    rollout = cfg.actor_rollout_ref.rollout
    return [
        f"rollout group (trainer.v1.trainer_mode=separate_async): {on_rollout.n_workers} worker(s) "
        f"(actor_rollout_ref.rollout.nnodes={rollout.nnodes} × n_gpus_per_node={rollout.n_gpus_per_node}) beside "
        f"the trainer's {plan.n_workers}; {on_rollout.gen_rows} sequences per worker, generated "
        f"{plan.mode.lookahead} step(s) ahead of training; {gen.total / GiB:.3f} GiB per worker at generation "
        "(its actor and the rollout's tensors)"
    ]


def _width(term: str) -> int:
    return 16 if term == "activations" else 12  # room for both of the activations' figures
