"""The phases of a run on one worker and what each holds at its peak: the memory estimate of a config.

A worker holds every role the step plan places on it (``planner.worker_roles.ROLES``): the actor (+ rollout), the
reference unless the actor is its own (LoRA), the critic, the reward model, distillation's teachers. Each phase adds its
own terms (``trainer.preflight.memory_estimate``) to what persists: loading, every worker phase of the step that the
plan runs (``planner.phases.STEP_PHASES``, each by its estimator in ``PHASE_MEMORY``, keyed by the phase's name) and
validation's generation. Every phase knows the key that sizes its batch, so a refusal can name what to lower.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from config.distillation import uses_topk
from planner.batching import PHASE_BATCHES
from planner.dataflow import when
from planner.phases import STEP_PHASES, Step, StepPhase, uses_full_kl
from planner.plan import StepPlan
from planner.worker_roles import ACTOR, REF, ROLE, ROLES
from trainer.preflight.memory_estimate import (
    FP32,
    RUNTIME_CPU_BYTES,
    MemoryEstimate,
    Micro,
    ModelSizes,
    PhasePeak,
    Placement,
    activation_bytes,
    forward_transient,
    kv_cache_bytes,
    logits_bytes,
    placement,
    uses_math_attention,
)
from workers.compute.vllm_engine import VLLM_RUNTIME_CPU_BYTES, cpu_kv_cache_bytes


@dataclass(frozen=True)
class Role:
    sizes: ModelSizes
    placement: Placement
    trained: bool


@dataclass(frozen=True)
class Lengths:
    """Tokens per row: the configured maxima for the estimate's bound, or observed means (benchmarks)."""

    prompt: int
    response: int


def roles_on_worker(cfg: Any, plan: StepPlan, models: dict[str, ModelSizes], device: str) -> dict[str, Role]:
    """The roles one worker holds (``planner.worker_roles.ROLES`` that the plan places: each model of a role of
    several), with their sizes and placement; ``models`` has the sizes of each model (a role that shares another's
    model uses that one's)."""
    step = Step(cfg, plan)
    return {
        name: Role(
            models[r.shares or name],
            placement(device, plan.n_workers, r.fsdp(cfg), r.trained),
            r.trained,
        )
        for r in ROLES
        if r.held(step)
        for name in r.paths(cfg)
    }


def estimate_memory(
    cfg: Any,
    plan: StepPlan,
    models: dict[str, ModelSizes],
    device: str,
    lengths: Lengths | None = None,
    val_rows: int = 0,
) -> MemoryEstimate:
    """Every phase's peak on one worker for ``cfg`` (device "cpu" or "cuda"); ``val_rows``: validation rows
    generated at once on a worker (0: no validation)."""
    est = _Estimator(
        cfg,
        plan,
        roles_on_worker(cfg, plan, models, device),
        device,
        lengths or Lengths(cfg.data.max_prompt_length, cfg.data.max_response_length),
    )
    return MemoryEstimate(device, tuple(p for p in est.phases(val_rows) if p is not None))


class _Estimator:
    def __init__(self, cfg: Any, plan: StepPlan, roles: dict[str, Role], device: str, lengths: Lengths) -> None:
        self.cfg, self.plan, self.roles, self.device, self.lengths = cfg, plan, roles, device, lengths
        self.rows = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n // plan.n_workers
        self.width = cfg.data.max_prompt_length + cfg.data.max_response_length
        self.vllm = cfg.actor_rollout_ref.rollout.name == "vllm"

    def phases(self, val_rows: int) -> list[PhasePeak]:
        step = [PHASE_MEMORY[p.name](self, p, name) for p, name in self.worker_phases()]
        validate = when(val_rows > 0, self.generate("validate", val_rows, "data.val_batch_size"))
        return [self.load(), *step, *validate]

    def worker_phases(self) -> list[tuple[StepPhase, str]]:
        """(phase, the name of its peak) of each worker phase the plan runs; a role of several models
        (distillation's teachers) runs its phase once per model, under that model's name."""
        out = []
        for p in STEP_PHASES:
            if p.name in PHASE_MEMORY and self.plan.runs(p.name):
                role = ROLE[p.role]
                out += [(p, n) for n in role.paths(self.cfg)] if role.instances else [(p, p.name)]
        return out

    def role(self, phase: StepPhase, name: str) -> tuple[str, Role]:
        """The model that computes ``phase`` (its peak called ``name``) on this worker, by name: its role's (one of
        a role of several, by the peak's name), or the one its role shares a model with."""
        if ROLE[phase.role].instances:
            return name, self.roles[name]
        name = phase.role if phase.role in self.roles else ROLE[phase.role].shares
        return name, self.roles[name]

    # ------------------------------------------------------------------ what persists
    def persistent(self, active: str | None = None, updating: str | None = None) -> dict[str, int]:
        """Weights and optimizer state held through a phase (offloaded ones only while their role computes)."""
        weights = sum(
            r.placement.persistent(r.sizes, r.trained)
            for name, r in self.roles.items()
            if not r.placement.offload_params or name == active
        )
        optimizer = sum(
            r.placement.optimizer(r.sizes)
            for name, r in self.roles.items()
            if r.trained and (not r.placement.offload_optimizer or name == updating)
        )
        runtime = RUNTIME_CPU_BYTES + self.rows * self.width * 8 * 6 if self.device == "cpu" else 0
        if self.vllm and self.device == "cpu":  # the engine keeps its weights and its own share of the process
            actor = self.roles[ACTOR.name]
            weights += actor.placement.compute_bytes * actor.sizes.params
            runtime += VLLM_RUNTIME_CPU_BYTES
        return {"weights": weights, "optimizer": optimizer, "runtime": runtime}

    def _phase(
        self,
        name: str,
        role: str,
        terms: dict[str, int],
        micro: Micro | None = None,
        key: str | None = None,
        updating: bool = False,
        activations_other: int | None = None,
    ) -> PhasePeak:
        base = self.persistent(active=role, updating=role if updating else None)
        merged = {k: base.get(k, 0) + terms.get(k, 0) for k in {*base, *terms}}
        return PhasePeak(name, merged, micro, key, activations_other)

    # ------------------------------------------------------------------ phases
    def load(self) -> PhasePeak:
        """Each role is read in full fp32 before it is sharded or cast: the largest one's extra at the end."""
        extra = max(
            max(FP32 * r.sizes.params - r.placement.persistent(r.sizes, r.trained), 0) for r in self.roles.values()
        )
        terms = {"weights": sum(r.placement.persistent(r.sizes, r.trained) for r in self.roles.values()) + extra}
        return PhasePeak("load", {**terms, "runtime": self.persistent()["runtime"]})

    def generate(self, name: str, rows: int, key: str) -> PhasePeak:
        """Every row of the worker decodes at once over a StaticCache; prefill runs on the prompts."""
        actor = self.roles[ACTOR.name]
        c, m = actor.placement.compute_bytes, actor.sizes
        if self.vllm:
            return self._phase(name, ACTOR.name, self.vllm_generate(m, c, rows), key=key)
        merged = c * m.merged  # LoRA samples with merged copies of its linears, in the compute dtype
        terms = {
            "weights": actor.placement.gathered(m, whole=True) + merged,
            # a partial rollout's continued rows: their tokens so far join the prompt, and R more come
            "kv_cache": kv_cache_bytes(m, rows, self.width + self.plan.mode.partial * self.lengths.response, c),
            "activations": forward_transient(m, rows * self.cfg.data.max_prompt_length, c),
            "logits": 4 * rows * m.vocab * FP32,
        }  # the last position's, as sampling scales and sorts them
        return self._phase(name, ACTOR.name, terms, key=key)

    def vllm_generate(self, m: ModelSizes, c: int, rows: int) -> dict[str, int]:
        """The vLLM engine's rollout: the sync gathers one FSDP unit at a time; the KV cache is its reservation (a
        CPU's for the step's rows, ``workers.compute.vllm_rollout``; on CUDA gpu_memory_utilization of the device, its
        weights included, which sleep mode frees between rollouts); vLLM prefills at most
        ``max_num_batched_tokens`` tokens a step and samples ``max_num_seqs`` rows at once."""
        rollout = self.cfg.actor_rollout_ref.rollout
        engine = c * m.params
        if self.device == "cpu":
            kv = cpu_kv_cache_bytes(
                rollout, m.layers, m.kv_dim, c, self.plan.gen_rows, self.cfg.trainer.n_gpus_per_node
            )
        elif torch.cuda.is_available():
            kv = max(int(rollout.gpu_memory_utilization * torch.cuda.get_device_properties(0).total_memory) - engine, 0)
        else:  # a dry run for GPUs on a machine without one: what the step's rows need, a lower bound
            kv = kv_cache_bytes(m, self.plan.gen_rows, self.width, c)
        return {
            "weights": self.roles[ACTOR.name].placement.gathered(m) + (engine if self.device != "cpu" else 0),
            "kv_cache": kv,
            "activations": forward_transient(
                m, min(rows * self.cfg.data.max_prompt_length, rollout.max_num_batched_tokens), c
            ),
            "logits": 4 * min(rows, rollout.max_num_seqs) * m.vocab * FP32,
        }

    def micro(self, rows: int, packed: bool, dynamic_budget: int | None, policy: bool = False) -> Micro:
        """A micro-batch of ``rows``; a ``policy`` forward's (actor, reference) groups of n share their prompt
        with ``actor.use_prefix_grouper``."""
        length = self.lengths.prompt + self.lengths.response
        if dynamic_budget is not None:  # micro-batches of at most this many valid tokens
            rows = max(1, min(rows, dynamic_budget // length))
        arr = self.cfg.actor_rollout_ref
        group = arr.rollout.n if policy and arr.actor.use_prefix_grouper else 1
        return Micro(rows, self.lengths.prompt, self.lengths.response, self.width, packed, group)

    def batch(self, phase: StepPhase, rows: int) -> tuple[Any, Micro, str]:
        """(the section of ``phase``'s batch keys, one micro-batch of its ``rows``, the key that sizes it)."""
        b, cfg = PHASE_BATCHES[phase.name], self.cfg
        section = b.config(cfg)
        dynamic = getattr(section, b.budget) if b.is_dynamic(section) else None
        model = ROLE[phase.role].model_config(cfg)
        policy = not ROLE[phase.role].value_head  # the actor's and the reference's forwards share prompts
        micro_rows = min(getattr(section, b.micro) or rows, rows)
        micro = self.micro(micro_rows, bool(getattr(model, "use_remove_padding", False)), dynamic, policy)
        return section, micro, b.key(cfg)

    def forward(self, phase: StepPhase, peak: str) -> PhasePeak:
        """A no-grad forward per micro-batch: a block's temporaries, and an LM head's logits."""
        name, r = self.role(phase, peak)
        _, micro, key = self.batch(phase, self.rows)
        tokens, _, head = micro.geometry(r.sizes)
        c = r.placement.compute_bytes
        terms = {"weights": r.placement.gathered(r.sizes), "activations": forward_transient(r.sizes, tokens, c)}
        if not ROLE[phase.role].value_head:
            fused = self.cfg.actor_rollout_ref.model.use_fused_kernels
            n = tokens_response(micro)
            terms["logits"] = logits_bytes(head, n, r.sizes.vocab, c, micro.packed, backward=False, fused=fused)
        return self._phase(peak, name, terms, micro, key)

    def update(self, phase: StepPhase, peak: str) -> PhasePeak:
        """Forward and backward per micro-batch of the role's mini-batch: activations (with gradient checkpointing
        as configured, and switched), gradients, and an LM head's logits (with the full KL's, the reference's too)."""
        name, r = self.role(phase, peak)
        section, micro, key = self.batch(phase, getattr(self.plan, PHASE_BATCHES[phase.name].mini))
        tokens, width, head = micro.geometry(r.sizes)
        c = r.placement.compute_bytes
        math = uses_math_attention(r.sizes, self.device, c, width)

        def acts(checkpointing: bool) -> int:
            return activation_bytes(r.sizes, tokens, width, c, math, checkpointing)

        ckpt = bool(ROLE[phase.role].model_config(self.cfg).enable_gradient_checkpointing)
        terms = {
            "weights": r.placement.gathered(r.sizes),
            "gradients": r.placement.gradients(r.sizes),
            "activations": acts(ckpt),
        }
        if not ROLE[phase.role].value_head:
            terms["logits"], weights = self.update_logits(section, micro, head, r)
            terms["weights"] += weights
        return self._phase(peak, name, terms, micro, key, updating=True, activations_other=acts(not ckpt))

    def update_logits(self, actor: Any, micro: Micro, head: int, r: Role) -> tuple[int, int]:
        """(logits bytes, extra weights) of a policy update: with the exact KL loss the reference's logits and the
        KL's log-softmaxes beside the policy's, and the reference's gathered weights."""
        n, vocab, c = tokens_response(micro), r.sizes.vocab, r.placement.compute_bytes
        fused = self.cfg.actor_rollout_ref.model.use_fused_kernels
        logits = logits_bytes(
            head, n, vocab, c, micro.packed, backward=True, fused=fused, entropy_grad=actor.entropy_coeff != 0
        )
        distillation = self.cfg.distillation
        if distillation.enabled and uses_topk(distillation):  # the teacher's k ids and log-probs, the student's
            logits += n * distillation.distillation_loss.topk * (8 + 3 * FP32)
        if not uses_full_kl(actor):
            return logits, 0
        logits += logits_bytes(head, n, vocab, c, micro.packed, backward=False, fused=fused)
        logits += 0 if fused else 2 * n * vocab * FP32
        ref = self.roles.get(REF.name)
        return logits, ref.placement.gathered(ref.sizes) if ref else 0

    def generate_step(self, phase: StepPhase, peak: str) -> PhasePeak:
        """The step's generation: every row of the worker's share of a generation batch at once."""
        batching = PHASE_BATCHES[phase.name]
        return self.generate(peak, getattr(self.plan, batching.rows), batching.key(self.cfg))


# each worker phase's memory estimate (of planner.phases.STEP_PHASES, by name): (phase, the name of its peak) -> peak
PHASE_MEMORY: dict[str, Callable[[_Estimator, StepPhase, str], PhasePeak]] = {
    "gen": _Estimator.generate_step,
    "rm_score": _Estimator.forward,
    "old_log_prob": _Estimator.forward,
    "ref": _Estimator.forward,
    "teacher": _Estimator.forward,
    "values": _Estimator.forward,
    "update_critic": _Estimator.update,
    "update_actor": _Estimator.update,
}


def tokens_response(micro: Micro) -> int:
    """Response tokens whose log-probs a micro-batch computes (N)."""
    return micro.rows * micro.response
