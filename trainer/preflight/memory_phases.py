"""The phases of a run on one worker and what each holds at its peak: the memory estimate of a config.

A worker holds every role the step plan places on it (``workers.roles.fsdp_workers``): the actor (+ rollout), the
reference unless the actor is its own (LoRA), the critic, the reward model. Each phase adds its own terms
(``trainer.preflight.memory_estimate``) to what persists; the phases are the step's (generation, log-probs, values, the
updates), validation's generation, and loading. Every phase knows the key that sizes its batch, so a refusal
can name what to lower.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from config.plan import StepPlan, uses_full_kl
from trainer.preflight.memory_estimate import (
    FP32,
    RUNTIME_CPU_BYTES,
    MemoryEstimate,
    Micro,
    ModelSizes,
    Phase,
    Placement,
    activation_bytes,
    forward_transient,
    kv_cache_bytes,
    logits_bytes,
    placement,
    uses_math_attention,
)

ARR = "actor_rollout_ref"


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
    """The roles one worker holds, with their sizes and placement; ``models`` has actor, critic and rm sizes."""
    arr, n = cfg.actor_rollout_ref, plan.n_workers
    roles = {"actor": Role(models["actor"], placement(device, n, arr.actor.fsdp_config, True), True)}
    if plan.use_reference_policy and arr.model.lora_rank == 0:  # a LoRA actor is its own reference
        roles["ref"] = Role(models["actor"], placement(device, n, arr.ref.fsdp_config, False), False)
    if plan.use_critic:
        roles["critic"] = Role(models["critic"], placement(device, n, cfg.critic.fsdp, True), True)
    if cfg.reward.reward_model.enable:
        roles["rm"] = Role(models["rm"], placement(device, n, cfg.reward.reward_model.fsdp_config, False), False)
    return roles


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

    def phases(self, val_rows: int) -> list[Phase | None]:
        arr, cfg, plan = self.cfg.actor_rollout_ref, self.cfg, self.plan
        ref = "ref" if "ref" in self.roles else "actor"
        return [
            self.load(),
            self.generate(
                "generate",
                plan.gen_batch_size * arr.rollout.n // plan.n_workers,
                f"data.{'gen' if plan.dynamic_sampling else 'train'}_batch_size × {ARR}.rollout.n",
            ),
            self.generate("validate", val_rows, "data.val_batch_size") if val_rows else None,
            self.log_prob("old_log_prob", "actor", arr.rollout, f"{ARR}.rollout")
            if plan.recompute_old_log_prob
            else None,
            self.log_prob("ref", ref, arr.ref, f"{ARR}.ref") if plan.compute_ref_log_prob else None,
            self.values() if plan.use_critic else None,
            self.update_critic() if plan.use_critic else None,
            self.update_actor(),
            self.rm_score() if cfg.reward.reward_model.enable else None,
        ]

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
    ) -> Phase:
        base = self.persistent(active=role, updating=role if updating else None)
        merged = {k: base.get(k, 0) + terms.get(k, 0) for k in {*base, *terms}}
        return Phase(name, merged, micro, key, activations_other)

    # ------------------------------------------------------------------ phases
    def load(self) -> Phase:
        """Each role is read in full fp32 before it is sharded or cast: the largest one's extra at the end."""
        extra = max(
            max(FP32 * r.sizes.params - r.placement.persistent(r.sizes, r.trained), 0) for r in self.roles.values()
        )
        terms = {"weights": sum(r.placement.persistent(r.sizes, r.trained) for r in self.roles.values()) + extra}
        return Phase("load", {**terms, "runtime": self.persistent()["runtime"]})

    def generate(self, name: str, rows: int, key: str) -> Phase:
        """Every row of the worker decodes at once over a StaticCache; prefill runs on the prompts."""
        actor = self.roles["actor"]
        c, m = actor.placement.compute_bytes, actor.sizes
        merged = FP32 * m.merged if c == FP32 else 0  # fp32 LoRA samples with merged copies of its linears
        terms = {
            "weights": actor.placement.gathered(m, whole=True) + merged,
            "kv_cache": kv_cache_bytes(m, rows, self.width, c),
            "activations": forward_transient(m, rows * self.cfg.data.max_prompt_length, c),
            "logits": 4 * rows * m.vocab * FP32,
        }  # the last position's, as sampling scales and sorts them
        return self._phase(name, "actor", terms, key=key)

    def micro(self, rows: int, packed: bool, dynamic_budget: int | None, policy: bool = False) -> Micro:
        """A micro-batch of ``rows``; a ``policy`` forward's (actor, reference) groups of n share their prompt
        with ``actor.use_prefix_grouper``."""
        length = self.lengths.prompt + self.lengths.response
        if dynamic_budget is not None:  # micro-batches of at most this many valid tokens
            rows = max(1, min(rows, dynamic_budget // length))
        arr = self.cfg.actor_rollout_ref
        group = arr.rollout.n if policy and arr.actor.use_prefix_grouper else 1
        return Micro(rows, self.lengths.prompt, self.lengths.response, self.width, packed, group)

    def log_prob(self, name: str, role: str, section: Any, prefix: str) -> Phase:
        """A no-grad forward per micro-batch: a block's temporaries and the logits."""
        dynamic = section.log_prob_max_token_len_per_gpu if section.log_prob_use_dynamic_bsz else None
        micro_rows = section.log_prob_micro_batch_size_per_gpu or self.rows
        micro = self.micro(
            min(micro_rows, self.rows), self.cfg.actor_rollout_ref.model.use_remove_padding, dynamic, policy=True
        )
        r = self.roles[role]
        tokens, _, head = micro.geometry(r.sizes)
        c = r.placement.compute_bytes
        terms = {
            "weights": r.placement.gathered(r.sizes),
            "activations": forward_transient(r.sizes, tokens, c),
            "logits": logits_bytes(
                head,
                tokens_response(micro),
                r.sizes.vocab,
                c,
                micro.packed,
                backward=False,
                fused=self.cfg.actor_rollout_ref.model.use_fused_kernels,
            ),
        }
        key = (
            f"{prefix}.log_prob_max_token_len_per_gpu"
            if dynamic is not None
            else f"{prefix}.log_prob_micro_batch_size_per_gpu"
        )
        return self._phase(name, role, terms, micro, key)

    def values(self) -> Phase:
        critic, cfg = self.roles["critic"], self.cfg.critic
        dynamic = cfg.forward_max_token_len_per_gpu if cfg.use_dynamic_bsz else None
        micro = self.micro(
            min(cfg.forward_micro_batch_size_per_gpu or self.rows, self.rows), cfg.model.use_remove_padding, dynamic
        )
        tokens, _, _ = micro.geometry(critic.sizes)
        terms = {
            "weights": critic.placement.gathered(critic.sizes),
            "activations": forward_transient(critic.sizes, tokens, critic.placement.compute_bytes),
        }
        key = "critic.forward_max_token_len_per_gpu" if dynamic else "critic.forward_micro_batch_size_per_gpu"
        return self._phase("values", "critic", terms, micro, key)

    def update(
        self, role: str, section: Any, mini: int, model_cfg: Any, prefix: str
    ) -> tuple[dict[str, int], Micro, str, int, int]:
        """(terms, micro-batch, its key, activations with checkpointing switched, LM-head positions) of a role's
        update."""
        r = self.roles[role]
        dynamic = section.ppo_max_token_len_per_gpu if section.use_dynamic_bsz else None
        micro = self.micro(
            min(section.ppo_micro_batch_size_per_gpu or mini, mini),
            model_cfg.use_remove_padding,
            dynamic,
            policy=role == "actor",
        )
        tokens, width, head = micro.geometry(r.sizes)
        c = r.placement.compute_bytes
        math = uses_math_attention(r.sizes, self.device, c, width)

        def acts(checkpointing: bool) -> int:
            return activation_bytes(r.sizes, tokens, width, c, math, checkpointing)

        ckpt = bool(model_cfg.enable_gradient_checkpointing)
        terms = {
            "weights": r.placement.gathered(r.sizes),
            "gradients": r.placement.gradients(r.sizes),
            "activations": acts(ckpt),
        }
        key = f"{prefix}.ppo_max_token_len_per_gpu" if dynamic else f"{prefix}.ppo_micro_batch_size_per_gpu"
        return terms, micro, key, acts(not ckpt), head

    def update_critic(self) -> Phase:
        terms, micro, key, other, _ = self.update(
            "critic", self.cfg.critic, self.plan.critic_mini_batch_size, self.cfg.critic.model, "critic"
        )
        return self._phase("update_critic", "critic", terms, micro, key, updating=True, activations_other=other)

    def update_actor(self) -> Phase:
        arr = self.cfg.actor_rollout_ref
        terms, micro, key, other, head = self.update(
            "actor", arr.actor, self.plan.actor_mini_batch_size, arr.model, f"{ARR}.actor"
        )
        actor = self.roles["actor"]
        n, vocab, c = tokens_response(micro), actor.sizes.vocab, actor.placement.compute_bytes
        fused = arr.model.use_fused_kernels
        terms["logits"] = logits_bytes(
            head, n, vocab, c, micro.packed, backward=True, fused=fused, entropy_grad=arr.actor.entropy_coeff != 0
        )
        if uses_full_kl(arr.actor):  # the reference's logits and the exact KL's log-softmaxes beside them
            terms["logits"] += logits_bytes(head, n, vocab, c, micro.packed, backward=False, fused=fused) + (
                0 if fused else 2 * n * vocab * FP32
            )
            if "ref" in self.roles:
                terms["weights"] += self.roles["ref"].placement.gathered(self.roles["ref"].sizes)
        return self._phase("update_actor", "actor", terms, micro, key, updating=True, activations_other=other)

    def rm_score(self) -> Phase:
        rm = self.roles["rm"]
        micro = self.micro(min(self.cfg.reward.reward_model.micro_batch_size_per_gpu, self.rows), False, None)
        tokens, _, _ = micro.geometry(rm.sizes)
        terms = {
            "weights": rm.placement.gathered(rm.sizes),
            "activations": forward_transient(rm.sizes, tokens, rm.placement.compute_bytes),
        }
        return self._phase("rm_score", "rm", terms, micro, "reward.reward_model.micro_batch_size_per_gpu")


def tokens_response(micro: Micro) -> int:
    """Response tokens whose log-probs a micro-batch computes (N)."""
    return micro.rows * micro.response
