"""Ray-side role workers on FSDP2: the actor/rollout/reference worker, and the helpers every role's process uses
(the scoring roles, critic, reward model and distillation teachers, are ``scoring_workers``).

Each class is a plain ``Worker`` subclass (the trainer wraps it with ``ray.remote``); each ``@register``-ed method
runs on every rank with its chunk of the batch. Each data method is one phase of ``planner.phases``: it takes its
inputs from ``STORE.inputs`` (what the call carries, plus what an earlier phase kept in this process) and hands
its results to ``STORE.outputs``, which keeps what a later worker phase reads and returns what the driver reads
(``workers/compute/step_store.py``), as CPU tensors.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from planner.phases import PROMPT, uses_full_kl
from planner.plan import StepPlan
from single_controller.base.register import Dispatch, register
from single_controller.base.worker import Worker
from single_controller.data_proto import DataProto
from workers.compute.actor import DataParallelPPOActor
from workers.compute.agent_loop import build_agent_loop
from workers.compute.rollout import generate_sequences, partial_piece
from workers.compute.step_store import STORE
from workers.compute.turn_sampler import HFTurnSampler
from workers.compute.vllm_rollout import VLLMRollout, VLLMTurnSampler
from workers.parallel import fsdp, lora
from workers.roles.role import FrozenRole, TrainedRole
from workers.roles.weight_sync import WeightSync
from workers.runtime import malloc
from workers.tools.turns import eos_token_ids

ROLES = ("actor_rollout", "ref", "actor_rollout_ref")
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "do_sample")


def setup_process(worker: Worker, seed: int, deterministic: bool) -> None:
    """CPU threads (workers × threads ≤ cores) and malloc, per-rank seed, determinism, the torch.distributed world."""
    if worker.device.type == "cpu":
        torch.set_num_threads(malloc.compute_threads(worker.local_world_size))
        malloc.keep_freed_memory()  # glibc only: the trainer preloads mimalloc if installed (workers/runtime/malloc.py)
    torch.manual_seed(seed + worker.rank)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    worker.init_process_group()


def check_world(worker: Worker, plan: StepPlan) -> None:
    if plan.n_workers != worker.world_size:
        raise ValueError(f"the step plan is for {plan.n_workers} workers, this group has {worker.world_size}")


def load_causal_lm(model_config: Any) -> nn.Module:
    """The fp32 causal LM of ``model_config`` (``actor_rollout_ref.model``), its config's attributes replaced by
    ``override_config``, activation checkpointing as configured."""
    model = AutoModelForCausalLM.from_pretrained(
        model_config.path,
        dtype=torch.float32,
        trust_remote_code=model_config.trust_remote_code,
        **(getattr(model_config, "override_config", None) or {}),
    )
    if model_config.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


class ActorRolloutRefWorker(WeightSync, Worker):
    """The policy in its three roles: rollout (sampling), actor (PPO update) and/or frozen reference.

    ``config``: the ``actor_rollout_ref`` section; ``role``: one of ``ROLES``; ``plan``: the step plan. Rollout runs
    on the actor's own FSDP module (or a vLLM engine beside it); ``ref`` holds a frozen copy; ``actor_rollout_ref``
    both in one object (``kl_loss_type=full`` reads the reference logits in the loss; a LoRA actor is its own
    reference, adapters disabled: ``workers.parallel.lora``); ``WeightSync``: the weights of a rollout group."""

    def __init__(self, config: Any, role: str, plan: StepPlan, distillation: Any = None) -> None:
        super().__init__()
        self.distillation = distillation  # the distillation section: its loss joins the actor's when enabled
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; valid: {list(ROLES)}")
        check_world(self, plan)
        self.config, self.role, self.plan = config, role, plan
        self._is_actor = role in ("actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref")
        if role == "ref" and config.model.lora_rank > 0:
            raise ValueError(
                f"actor_rollout_ref.model.lora_rank={config.model.lora_rank}: the reference of a LoRA "
                "actor is its own module with the adapters disabled; use role 'actor_rollout_ref'"
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int = 0, seed: int = 1, deterministic: bool = False) -> None:
        """Load tokenizer and model(s), shard them, build optimizer and LR schedule (actor role only)."""
        setup_process(self, seed, deterministic)
        cfg = self.config
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
        remove_padding = cfg.model.use_remove_padding
        if self._is_ref and cfg.model.lora_rank == 0:
            self.ref = FrozenRole(self, load_causal_lm(cfg.model), cfg.ref.fsdp_config)
        if self._is_actor:
            model = lora.add_adapters(load_causal_lm(cfg.model), cfg.model)
            self.trained = TrainedRole(
                self,
                model,
                cfg.actor.fsdp_config,
                cfg.actor.optim,
                total_training_steps,
                compile=cfg.actor.compile_model,
            )
            if self._is_ref and cfg.model.lora_rank > 0:  # runs under lora.as_reference: adapters disabled
                self.ref = self.trained
            self.actor = DataParallelPPOActor(
                self.trained.module,
                self.trained.optimizer,
                self.trained.lr_scheduler,
                cfg.actor,
                self.plan.actor_mini_batch_size,
                use_remove_padding=remove_padding,
                ref_module=self.ref.module if self._is_ref and uses_full_kl(cfg.actor) else None,
                use_fused_kernels=cfg.model.use_fused_kernels,
                use_prefix_grouper=cfg.actor.use_prefix_grouper,
                distillation=self.distillation if self.distillation and self.distillation.enabled else None,
            )
            self.generation_config = getattr(self.trained.module, "generation_config", None)  # HF models have one
            # rollout.name=vllm: the engine lives here, beside the actor, and takes its weights before each rollout
            self.engine = VLLMRollout.of_worker(self, seed) if cfg.rollout.name == "vllm" else None
            # tool-calling rollouts (rollout.multi_turn): loading the tools runs the code the tool config names
            multi_turn = cfg.rollout.multi_turn.enable
            self.agent_loop = build_agent_loop(self.tokenizer, cfg.rollout) if multi_turn else None
        if self._is_ref:
            self.ref_policy = DataParallelPPOActor(
                self.ref.module,
                None,
                None,
                cfg.actor,
                use_remove_padding=remove_padding,
                use_fused_kernels=cfg.model.use_fused_kernels,
                use_prefix_grouper=cfg.actor.use_prefix_grouper,
            )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample one response per prompt row (the driver repeats prompts n times beforehand; the repeats share one
        prefill); a partial rollout's piece continues rows instead (``rollout.partial_piece``).

        Sampling settings come from ``config.rollout``; ``meta_info`` may override temperature, top_p, top_k and
        do_sample (validation passes ``val_kwargs``). Writes responses, input_ids, attention_mask, position_ids and
        response_mask, and with ``rollout.calculate_log_probs`` rollout_log_probs (the sampled tokens' log-probs
        under this very policy, which are also the old log-probs when the plan takes them from the rollout); with
        ``rollout.multi_turn.enable`` the agent loop's tensors instead (log-probs 0 on tool tokens), and its per-row
        non-tensors (``workers.compute.agent_loop``), reading ``raw_prompt``/``agent_name``/``tools_kwargs``.
        """
        inputs = STORE.inputs(prompts)
        if not self._is_actor:
            raise RuntimeError(f"generate_sequences needs the actor; this worker's role is {self.role!r}")
        rollout = self.config.rollout
        sampling = {k: inputs.meta_info.get(k, getattr(rollout, k)) for k in SAMPLING_KEYS}
        pad_id = self.tokenizer.pad_token_id
        eos_ids = eos_token_ids(self.generation_config, self.tokenizer)
        start = time.perf_counter()
        if "seed" in inputs.meta_info:  # generation ahead of training: each batch its own seed (a resume's too)
            torch.manual_seed(inputs.meta_info["seed"] + self.rank)
        with self.trained.onloaded(), self._sampler() as module:
            ids = {"eos_token_id": eos_ids, "pad_token_id": pad_id if pad_id is not None else eos_ids[0]}
            if self.agent_loop is not None:  # multi-turn: rows with agent_name tool_agent call tools
                turns = HFTurnSampler(module, compile_decode=rollout.compile_decode)  # compiled: decode.resolve
                out, rows, metrics = self.agent_loop.generate(
                    turns if self.engine is None else VLLMTurnSampler(module),
                    inputs.batch,
                    inputs.non_tensor_batch,
                    response_length=int(rollout.response_length),
                    sampling=sampling,
                    return_log_probs=rollout.calculate_log_probs,
                    **ids,
                )
            else:
                out = (module.generate if self.engine is not None else partial(generate_sequences, module))(
                    *(inputs.batch[k] for k in PROMPT),
                    response_length=int(rollout.response_length),
                    return_log_probs=rollout.calculate_log_probs,
                    **ids,
                    **sampling,
                    **partial_piece(inputs.batch, inputs.meta_info),
                    **({} if self.engine is not None else {"compile_decode": rollout.compile_decode}),
                )
                rows, metrics = None, {}
        if self.plan.old_log_prob_from_rollout:  # the sampling policy is the pre-update policy
            out["old_log_probs"] = out["rollout_log_probs"]
        metrics["timing_s/worker_gen"] = time.perf_counter() - start
        if self.engine is not None:
            metrics["timing_s/update_weights"] = self.engine.sync_seconds
        return STORE.outputs(prompts, out, meta_info={"metrics": metrics}, non_tensors=rows)

    @contextmanager
    def _sampler(self) -> Iterator[Any]:
        """What samples: the vLLM engine synced with the actor, or the actor's own module gathered (LoRA sampling
        with merged weights, one matmul per linear; the update runs the adapters as they are)."""
        if self.engine is not None:
            with self.engine.awake(self.trained.module) as engine:
                yield engine
            return
        with fsdp.gathered_params(self.trained.module) as module, lora.merged_adapters(module):
            module.eval()
            yield module

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` (B, R) of the responses under the current policy (``actor/entropy`` is the update's),
        and ``sum_pi_squared`` (B, R) when the plan says so."""
        inputs, rollout = STORE.inputs(data), self.config.rollout
        with self.trained.onloaded():
            stats = self.actor.compute_token_stats(
                inputs,
                micro_batch_size=rollout.log_prob_micro_batch_size_per_gpu,
                temperature=rollout.temperature,
                max_token_len=rollout.log_prob_max_token_len_per_gpu if rollout.log_prob_use_dynamic_bsz else None,
                stats=("sum_pi_squared",) if self.plan.compute_sum_pi_squared else (),
            )
        stats = {"old_log_probs" if name == "log_probs" else name: value for name, value in stats.items()}
        return STORE.outputs(data, stats)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` (B, R) of the responses under the frozen reference policy."""
        inputs = STORE.inputs(data)
        if not self._is_ref:
            raise RuntimeError(f"compute_ref_log_prob needs the reference model; this worker's role is {self.role!r}")
        ref = self.config.ref
        with self.ref.onloaded(), lora.as_reference(self.ref.module):
            log_probs, _ = self.ref_policy.compute_log_prob(
                inputs,
                micro_batch_size=ref.log_prob_micro_batch_size_per_gpu,
                temperature=self.config.rollout.temperature,
                max_token_len=ref.log_prob_max_token_len_per_gpu if ref.log_prob_use_dynamic_bsz else None,
            )
        return STORE.outputs(data, {"ref_log_prob": log_probs})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """One PPO update on this rank's rows; returns ``meta_info["metrics"]`` (name -> list of floats)."""
        if not self._is_actor:
            raise RuntimeError(f"update_actor needs the actor; this worker's role is {self.role!r}")
        inputs = STORE.inputs(data)
        meta_info = {**inputs.meta_info, "temperature": self.config.rollout.temperature}
        inputs = dataclasses.replace(inputs, meta_info=meta_info)
        # kl_loss_type=full runs the reference model inside the update (role actor_rollout_ref)
        with_ref = self.actor.ref_module is not None
        separate_ref = with_ref and self.ref is not self.trained  # not a LoRA actor's own module
        return self.trained.update(
            "actor",
            inputs,
            lambda: self.actor.update_policy(inputs),
            self.config.actor.ppo_epochs,
            reference_forward=with_ref,
            also_onloaded=self.ref.onloaded() if separate_ref else None,
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Write the actor under ``path``: an HF model directory plus optimizer, scheduler and RNG state."""
        self.trained.save(path, self.tokenizer)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what ``save_checkpoint`` wrote (from any world size)."""
        self.trained.load(path)
