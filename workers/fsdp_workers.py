"""Ray-side role workers: the actor/rollout/reference worker, the critic and the reward model, on FSDP2.

Each class is a plain ``Worker`` subclass (the trainer wraps it with ``ray.remote``); each ``@register``-ed
method runs on every rank with that rank's chunk of the batch. Methods return only the keys they add, as
CPU tensors, so little data travels back to the driver.
"""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from single_controller import DataProto
from single_controller.base import Worker
from single_controller.base.decorator import Dispatch, register
from workers import attention, checkpoint, fsdp, malloc, perf
from workers.actor import DataParallelPPOActor, uses_full_kl
from workers.critic import DataParallelPPOCritic, load_value_model
from workers.master_weights import MasterWeights, checkpointed, on_one_rank, optimizer_for
from workers.optim import build_lr_scheduler
from workers.reward_model import compute_rm_scores, load_reward_model
from workers.rollout import eos_token_ids, generate_sequences

ROLES = ("actor_rollout", "ref", "actor_rollout_ref")
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "do_sample")


def per_rank_mini_batch_size(
    prefix: str, mini_batch_size: int, rollout_n: int, world_size: int, micro_batch_size: int | None
) -> int:
    """Samples per optimizer step on one rank = mini_batch_size·n / world_size; must be a multiple of micro.

    ``prefix`` names the config section in the error messages (e.g. ``actor_rollout_ref.actor``);
    ``micro_batch_size`` None (dynamic batch size: micro-batches by token budget) skips the multiple check.
    """
    samples = mini_batch_size * rollout_n
    if samples % world_size:
        raise ValueError(
            f"{prefix}.ppo_mini_batch_size ({mini_batch_size}) × rollout n ({rollout_n}) = {samples} samples "
            f"must be divisible by the number of workers ({world_size})"
        )
    per_rank = samples // world_size
    if micro_batch_size is None:
        return per_rank
    # a micro-batch larger than the mini-batch is the whole mini-batch in one pass
    if micro_batch_size <= 0 or per_rank % min(micro_batch_size, per_rank):
        raise ValueError(
            f"{prefix}: the per-worker mini-batch ppo_mini_batch_size·n/world_size = "
            f"{mini_batch_size}·{rollout_n}/{world_size} = {per_rank} must be a multiple of "
            f"{prefix}.ppo_micro_batch_size_per_gpu ({micro_batch_size})"
        )
    return per_rank


def _setup_process(worker: Worker, seed: int, deterministic: bool) -> None:
    """CPU threads (workers × threads ≤ cores) and malloc, per-rank seed, determinism, the torch.distributed world."""
    if worker.device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // worker.local_world_size))
        malloc.keep_freed_memory()  # no page faults re-fetching each step's activations (see workers/malloc.py)
    torch.manual_seed(seed + worker.rank)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    worker.init_process_group()


def _mixed_precision(fsdp_config: Any) -> Any:
    """A role's ``fsdp_config.mixed_precision`` section (None where a hand-built config leaves it out)."""
    return getattr(fsdp_config, "mixed_precision", None)


def _shard(worker: Worker, model: nn.Module, fsdp_config: Any, trained: bool = False
           ) -> tuple[nn.Module, MasterWeights | None]:
    """Move ``model`` to the worker's device and shard it over all ranks in its configured compute dtype.

    Returns (the module to compute with, its ``MasterWeights`` or None). One rank has nothing to shard, and in
    bf16 FSDP's per-forward casts and hooks cost 5-10 % of a CPU step: a frozen model is cast once and a trained
    one computes on a bf16 copy of fp32 masters (``master_weights.on_one_rank``), unless its parameters are
    offloaded between phases (then FSDP keeps its fp32 parameters, in one group, and moves them).
    """
    model.to(worker.device)  # the default mesh then spans all ranks on this device type
    param_dtype, reduce_dtype = fsdp.role_precision(worker.device, _mixed_precision(fsdp_config))
    offloaded_masters = trained and param_dtype is not None and fsdp_config.param_offload
    if worker.world_size == 1 and not offloaded_masters:
        return on_one_rank(model, param_dtype, trained)
    return fsdp.apply_fsdp(
        model,
        param_dtype=param_dtype,
        reduce_dtype=reduce_dtype,
        reshard_after_forward=bool(getattr(fsdp_config, "reshard_after_forward", True)),
        min_num_params=int(getattr(getattr(fsdp_config, "wrap_policy", None), "min_num_params", 0)),
    ), None


def _load_causal_lm(model_config: Any) -> nn.Module:
    model = AutoModelForCausalLM.from_pretrained(
        model_config.path, dtype=torch.float32, trust_remote_code=bool(model_config.trust_remote_code)
    )
    if model_config.enable_gradient_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model


def _update_perf(role: str, device: torch.device, dtype: torch.dtype, flops: float, seconds: float
                 ) -> dict[str, list[float]]:
    """``perf/mfu/<role>`` of an update that did ``flops`` model FLOPs in ``seconds`` computing in ``dtype``
    (against that dtype's peak), the peak and memory metrics."""
    peak, _ = perf.peak_flops(device, dtype)
    metrics = {f"perf/mfu/{role}": perf.mfu(flops, seconds, peak), "perf/peak_tflops": peak / 1e12}
    return {k: [v] for k, v in {**metrics, **perf.memory_metrics(device)}.items()}


def _proto(tensors: dict[str, torch.Tensor], meta_info: dict | None = None) -> DataProto:
    return DataProto.from_dict({k: v.detach().cpu() for k, v in tensors.items()}, meta_info=meta_info)


class ActorRolloutRefWorker(Worker):
    """The policy in its three roles: rollout (sampling), actor (PPO update) and/or frozen reference.

    ``config`` is the ``actor_rollout_ref`` section; ``role`` is one of ``ROLES``. Rollout runs on the actor's
    own FSDP module (no second copy of the weights); ``ref`` holds a separate frozen copy. ``actor_rollout_ref``
    holds both in one object, which ``kl_loss_type=full`` needs: its loss reads the reference logits.
    """

    def __init__(self, config: Any, role: str) -> None:
        super().__init__()
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; valid: {list(ROLES)}")
        self.config = config
        self.role = role
        self._is_actor = role in ("actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref")
        if self._is_actor:  # fail at construction, before any model is loaded
            actor = config.actor
            self.mini_batch_size = per_rank_mini_batch_size(
                "actor_rollout_ref.actor",
                actor.ppo_mini_batch_size,
                config.rollout.n,
                self.world_size,
                None if actor.use_dynamic_bsz else actor.ppo_micro_batch_size_per_gpu,
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int = 0, seed: int = 1, deterministic: bool = False) -> None:
        """Load tokenizer and model(s), shard them, build optimizer and LR schedule (actor role only)."""
        _setup_process(self, seed, deterministic)
        cfg = self.config
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
        remove_padding = bool(cfg.model.use_remove_padding)
        if self._is_ref:
            ref_module = _load_causal_lm(cfg.model).requires_grad_(False).eval()
            ref_module, _ = _shard(self, ref_module, cfg.ref.fsdp_config)
            self.ref_policy = DataParallelPPOActor(ref_module, None, None, cfg.actor, use_remove_padding=remove_padding)
            if cfg.ref.fsdp_config.param_offload:
                fsdp.offload_fsdp_params(ref_module)
        if self._is_actor:
            module, weights = _shard(self, _load_causal_lm(cfg.model), cfg.actor.fsdp_config, trained=True)
            self.actor_checkpointed = checkpointed(module, weights)  # the fp32 masters where there are any
            self.actor_flops = perf.FlopsModel.of(module)
            self.actor_dtype = fsdp.compute_dtype(self.device, _mixed_precision(cfg.actor.fsdp_config))
            if cfg.actor.use_torch_compile:  # in place: rollout, log-prob and update forwards all compile
                module.compile()
            optimizer = optimizer_for(module, weights, cfg.actor.optim)
            scheduler = build_lr_scheduler(optimizer, cfg.actor.optim, total_training_steps)
            self.actor = DataParallelPPOActor(
                module, optimizer, scheduler, cfg.actor, self.mini_batch_size, use_remove_padding=remove_padding,
                ref_module=self.ref_policy.module if self._is_ref and uses_full_kl(cfg.actor) else None,
            )
            self.generation_config = getattr(module, "generation_config", None)
            self._offload_actor(module, optimizer)

    def _offload_actor(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if self.config.actor.fsdp_config.param_offload:
            fsdp.offload_fsdp_params(module)
        if self.config.actor.fsdp_config.optimizer_offload:
            fsdp.offload_optimizer(optimizer)

    def _ref_onloaded(self):
        offload = bool(self.config.ref.fsdp_config.param_offload)
        return fsdp.onloaded(self.ref_policy.module, self.device, offload_params=offload)

    def _actor_onloaded(self, with_optimizer: bool = False):
        fsdp_cfg = self.config.actor.fsdp_config
        return fsdp.onloaded(
            self.actor.module,
            self.device,
            self.actor.optimizer,
            offload_params=bool(fsdp_cfg.param_offload),
            offload_optimizer_state=bool(fsdp_cfg.optimizer_offload) and with_optimizer,
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample one response per prompt row (the driver repeats prompts n times beforehand).

        Sampling settings come from ``config.rollout``; ``prompts.meta_info`` may override temperature, top_p,
        top_k and do_sample (validation passes ``val_kwargs``). Returns prompts, responses, input_ids,
        attention_mask, position_ids and response_mask.
        """
        if not self._is_actor:
            raise RuntimeError(f"generate_sequences needs the actor; this worker's role is {self.role!r}")
        rollout = self.config.rollout
        sampling = {k: prompts.meta_info.get(k, getattr(rollout, k)) for k in SAMPLING_KEYS}
        pad_id = self.tokenizer.pad_token_id
        eos_ids = eos_token_ids(self.generation_config, self.tokenizer)
        start = time.perf_counter()
        with self._actor_onloaded(), fsdp.gathered_params(self.actor.module) as module:
            module.eval()
            out = generate_sequences(
                module,
                prompts.batch["input_ids"],
                prompts.batch["attention_mask"],
                prompts.batch["position_ids"],
                response_length=int(rollout.response_length),
                eos_token_id=eos_ids,
                pad_token_id=pad_id if pad_id is not None else eos_ids[0],
                **sampling,
            )
        metrics = {"timing_s/worker_gen": time.perf_counter() - start}
        return _proto(out, meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` (B, R) of the responses under the current policy (``actor/entropy`` is the update's)."""
        rollout = self.config.rollout
        with self._actor_onloaded():
            log_probs, _ = self.actor.compute_log_prob(
                data,
                micro_batch_size=rollout.log_prob_micro_batch_size_per_gpu,
                temperature=rollout.temperature,
                max_token_len=rollout.log_prob_max_token_len_per_gpu if rollout.log_prob_use_dynamic_bsz else None,
            )
        return _proto({"old_log_probs": log_probs})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` (B, R) of the responses under the frozen reference policy."""
        if not self._is_ref:
            raise RuntimeError(f"compute_ref_log_prob needs the reference model; this worker's role is {self.role!r}")
        ref = self.config.ref
        with self._ref_onloaded():
            log_probs, _ = self.ref_policy.compute_log_prob(
                data,
                micro_batch_size=ref.log_prob_micro_batch_size_per_gpu,
                temperature=self.config.rollout.temperature,
                max_token_len=ref.log_prob_max_token_len_per_gpu if ref.log_prob_use_dynamic_bsz else None,
            )
        return _proto({"ref_log_prob": log_probs})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """One PPO update on this rank's rows; returns ``meta_info["metrics"]`` (name -> list of floats)."""
        if not self._is_actor:
            raise RuntimeError(f"update_actor needs the actor; this worker's role is {self.role!r}")
        data = dataclasses.replace(data, meta_info={**data.meta_info, "temperature": self.config.rollout.temperature})
        start = time.perf_counter()
        # kl_loss_type=full runs the reference model inside the update (role actor_rollout_ref)
        ref_onloaded = self._ref_onloaded() if self.actor.ref_module is not None else nullcontext()
        width = data.batch["input_ids"].shape[1]
        with self._actor_onloaded(with_optimizer=True), ref_onloaded, \
                attention.sdpa_backend(self.actor.module, self.device, self.actor_dtype, width):
            metrics = self.actor.update_policy(data)
        seconds = time.perf_counter() - start
        flops = self.actor_flops.update_flops(data.batch["attention_mask"].sum(-1), self.config.actor.ppo_epochs,
                                              reference_forward=self.actor.ref_module is not None)
        metrics.update(_update_perf("actor", self.device, self.actor_dtype, flops, seconds))
        metrics["timing_s/worker_update_actor"] = [seconds]
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Write the actor under ``path``: an HF model directory plus optimizer, scheduler and RNG state."""
        with self._actor_onloaded(with_optimizer=True):
            checkpoint.save_role(path, self.actor_checkpointed, self.actor.optimizer, self.actor.lr_scheduler,
                                 self.tokenizer)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what ``save_checkpoint`` wrote (from any world size)."""
        with self._actor_onloaded(with_optimizer=True):
            checkpoint.load_role(path, self.actor_checkpointed, self.actor.optimizer, self.actor.lr_scheduler)


class CriticWorker(Worker):
    """The value model. ``config`` is the ``critic`` section (``config.model.path`` resolved by the trainer)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        micro = None if config.use_dynamic_bsz else config.ppo_micro_batch_size_per_gpu
        self.mini_batch_size = per_rank_mini_batch_size(
            "critic", config.ppo_mini_batch_size, config.rollout_n, self.world_size, micro
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int = 0, seed: int = 1, deterministic: bool = False) -> None:
        """Load the value model (zero-initialised head), shard it, build optimizer and LR schedule."""
        cfg = self.config
        _setup_process(self, seed, deterministic)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        model = load_value_model(cfg.model.path, trust_remote_code=bool(getattr(cfg.model, "trust_remote_code", False)))
        if cfg.model.enable_gradient_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        module, weights = _shard(self, model, cfg.fsdp_config, trained=True)
        self.critic_checkpointed = checkpointed(module, weights)
        self.critic_flops = perf.FlopsModel.of(module)
        self.critic_dtype = fsdp.compute_dtype(self.device, _mixed_precision(cfg.fsdp_config))
        optimizer = optimizer_for(module, weights, cfg.optim)
        scheduler = build_lr_scheduler(optimizer, cfg.optim, total_training_steps)
        self.critic = DataParallelPPOCritic(module, optimizer, scheduler, cfg, self.mini_batch_size)
        if cfg.fsdp_config.param_offload:
            fsdp.offload_fsdp_params(module)
        if cfg.fsdp_config.optimizer_offload:
            fsdp.offload_optimizer(optimizer)

    def _critic_onloaded(self, with_optimizer: bool = False):
        fsdp_cfg = self.config.fsdp_config
        return fsdp.onloaded(
            self.critic.module,
            self.device,
            self.critic.optimizer,
            offload_params=bool(fsdp_cfg.param_offload),
            offload_optimizer_state=bool(fsdp_cfg.optimizer_offload) and with_optimizer,
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R): V(s) before each response token, zero outside the response mask."""
        with self._critic_onloaded():
            values = self.critic.compute_values(data)
        return _proto({"values": values})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        """One value-loss update on this rank's rows; returns ``meta_info["metrics"]``."""
        start = time.perf_counter()
        width = data.batch["input_ids"].shape[1]
        with self._critic_onloaded(with_optimizer=True), \
                attention.sdpa_backend(self.critic.module, self.device, self.critic_dtype, width):
            metrics = self.critic.update_critic(data)
        seconds = time.perf_counter() - start
        flops = self.critic_flops.update_flops(data.batch["attention_mask"].sum(-1), self.config.ppo_epochs)
        metrics.update(_update_perf("critic", self.device, self.critic_dtype, flops, seconds))
        metrics["timing_s/worker_update_critic"] = [seconds]
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Write the value model under ``path`` (HF directory + optimizer, scheduler, RNG state)."""
        with self._critic_onloaded(with_optimizer=True):
            checkpoint.save_role(path, self.critic_checkpointed, self.critic.optimizer, self.critic.lr_scheduler,
                                 self.tokenizer)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what ``save_checkpoint`` wrote (from any world size)."""
        with self._critic_onloaded(with_optimizer=True):
            checkpoint.load_role(path, self.critic_checkpointed, self.critic.optimizer, self.critic.lr_scheduler)


class RewardModelWorker(Worker):
    """A frozen sequence-classification reward model. ``config`` is the ``reward_model`` section.

    It scores the policy's token ids as they are: the RM must share the policy's tokenizer (a different
    RM tokenizer, with decode and re-encode, is not supported yet).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int = 0, seed: int = 1, deterministic: bool = False) -> None:
        """Load the reward model and shard it (``total_training_steps`` is unused: it does not train)."""
        _setup_process(self, seed, deterministic)
        self.module, _ = _shard(self, load_reward_model(self.config.model.path), self.config.fsdp_config)
        if self.config.fsdp_config.param_offload:
            fsdp.offload_fsdp_params(self.module)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` (B, R): each sequence's score at its last valid response token, 0 elsewhere."""
        offload = bool(self.config.fsdp_config.param_offload)
        with fsdp.onloaded(self.module, self.device, offload_params=offload):
            scores = compute_rm_scores(self.module, data, int(self.config.micro_batch_size_per_gpu))
        return _proto({"rm_scores": scores})
