"""The models of one ``benchmarks.floor`` step as plain modules on one device, and that step's work.

``Floor`` loads the policy (LoRA adapters under ``lora.add_adapters``), the reference where a KL needs one and the
critic under GAE as the workers would, each computing in its role's ``fsdp_config.mixed_precision``; ``Floor.step``
runs one PPO / GRPO step's phases with the workers' code and times each (``_phase_timer``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from algos import compute_advantage
from benchmarks.memory import PhasePeaks
from planner.phases import uses_full_kl
from single_controller.data_proto import DataProto
from workers.compute import attention
from workers.compute.actor import DataParallelPPOActor
from workers.compute.critic import DataParallelPPOCritic, load_value_model
from workers.compute.rollout import generate_sequences
from workers.parallel import fsdp, lora
from workers.parallel.master_weights import on_one_rank, optimizer_for
from workers.roles.fsdp_workers import load_causal_lm
from workers.runtime import perf
from workers.tools.turns import eos_token_ids

RewardFn = Callable[[DataProto], tuple[torch.Tensor, dict]]


def _load(
    path: str,
    device: torch.device,
    dtype: torch.dtype,
    optim_config: Any | None,
    loader: Callable[[str], torch.nn.Module],
) -> tuple[torch.nn.Module, Any]:
    """(module computing in ``dtype``, its optimizer: AdamW over the fp32 weights, in bf16 over the masters of
    ``MasterWeights`` as a single worker rank has them; None without ``optim_config``)."""
    module, weights = on_one_rank(loader(path).to(device), dtype, trained=optim_config is not None)
    return module, None if optim_config is None else optimizer_for(module, weights, optim_config)


class Floor:
    """The models of one step (policy, optional reference and critic) as plain modules on one device."""

    def __init__(self, cfg: Any, device: torch.device, reward_fn: RewardFn, old_from_rollout: bool = False) -> None:
        from transformers import AutoTokenizer

        arr = cfg.actor_rollout_ref
        self.cfg, self.device, self.rollout, self.reward_fn = cfg, device, arr.rollout, reward_fn
        self.old_from_rollout = old_from_rollout  # the plan's: the rollout's log-probs are the old log-probs
        self.phases: PhasePeaks | None = None  # set to sample each phase's peak RSS (--phase-memory)
        self.sequences = cfg.data.train_batch_size * arr.rollout.n
        self.tokenizer = AutoTokenizer.from_pretrained(arr.model.path)

        def causal_lm(path: str) -> torch.nn.Module:  # as the workers load it (activation checkpointing included)
            return load_causal_lm(dataclasses.replace(arr.model, path=path))

        def policy_lm(path: str) -> torch.nn.Module:  # with lora_rank > 0 AdamW sees only the adapters
            return lora.add_adapters(causal_lm(path), arr.model)

        self.dtype = fsdp.compute_dtype(device, arr.actor.fsdp_config.mixed_precision)
        policy, optimizer = _load(arr.model.path, device, self.dtype, arr.actor.optim, policy_lm)
        self.n_params = sum(p.numel() for p in policy.parameters())
        self.trainable_params = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        self.eos_ids = eos_token_ids(getattr(policy, "generation_config", None), self.tokenizer)
        if arr.actor.compile_model:  # the same compiled forward as the trainer's workers
            policy.compile()
        packed, fused = bool(arr.model.use_remove_padding), bool(arr.model.use_fused_kernels)
        grouped = bool(arr.actor.use_prefix_grouper)
        self.ref, ref = None, None
        if arr.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:  # the trainer's use_reference_policy
            if lora.is_lora(policy):  # as the workers: the policy itself, run under lora.as_reference
                ref = policy
            else:
                ref_dtype = fsdp.compute_dtype(device, arr.ref.fsdp_config.mixed_precision)
                ref, _ = _load(arr.model.path, device, ref_dtype, None, causal_lm)
                ref = ref.requires_grad_(False).eval()
            self.ref = DataParallelPPOActor(
                ref,
                None,
                None,
                arr.actor,
                use_remove_padding=packed,
                use_fused_kernels=fused,
                use_prefix_grouper=grouped,
            )
        self.actor = DataParallelPPOActor(  # kl_loss_type=full reads the reference model inside the update
            policy,
            optimizer,
            None,
            arr.actor,
            self.sequences,
            use_remove_padding=packed,
            ref_module=ref if uses_full_kl(arr.actor) else None,
            use_fused_kernels=fused,
            use_prefix_grouper=grouped,
        )
        self.critic = None
        if cfg.algorithm.adv_estimator == "gae":
            self.critic_dtype = fsdp.compute_dtype(device, cfg.critic.fsdp.mixed_precision)
            value_model, optimizer = _load(
                cfg.critic.model.path, device, self.critic_dtype, cfg.critic.optim, load_value_model
            )
            self.critic = DataParallelPPOCritic(value_model, optimizer, None, cfg.critic, self.sequences)

    def step(self, prompts: DataProto) -> dict[str, float]:
        """One step's work on ``prompts`` (repeated n times, with ``uid`` per prompt); seconds per phase. Rewards and
        advantages are the trainer's (its reward function, ``algos.compute_advantage``), so the policy learns as in
        ``benchmarks.step`` and response lengths evolve alike."""
        timing: dict[str, float] = {}
        timer = _phase_timer(timing, self.device, self.phases)
        rollout, micro = self.rollout, self.sequences
        with timer("gen"):
            data = self._generate(prompts)
        tensors = data.batch
        with timer("reward"):
            scores, _ = self.reward_fn(data)
        with timer("old_log_prob"):  # timed for gen_fwd_train even where the rollout's log-probs replace it
            tensors["old_log_probs"], _ = self.actor.compute_log_prob(data, micro, rollout.temperature)
        if self.old_from_rollout:
            tensors["old_log_probs"] = tensors["rollout_log_probs"]
        if self.ref is not None:
            with timer("ref"), lora.as_reference(self.ref.module):
                tensors["ref_log_prob"], _ = self.ref.compute_log_prob(data, micro, rollout.temperature)
        if self.critic is not None:
            with timer("values"):
                tensors["values"] = self.critic.compute_values(data)
        algo = self.cfg.algorithm
        with timer("adv"):
            tensors["advantages"], tensors["returns"] = compute_advantage(
                algo.adv_estimator,
                token_level_rewards=scores,
                response_mask=tensors["response_mask"],
                values=tensors.get("values"),
                index=data.non_tensor_batch["uid"],
                gamma=algo.gamma,
                lam=algo.lam,
                norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
            )
        if self.critic is not None:
            with timer("update_critic"), self._attention(self.critic.module, self.critic_dtype, data):
                self.critic.update_critic(data)
        data.meta_info["temperature"] = rollout.temperature
        with timer("update_actor"), self._attention(self.actor.module, self.dtype, data):
            self.actor.update_policy(data)
        timing["response_tokens"] = float(tensors["response_mask"].sum())
        timing["tokens"] = float(tensors["attention_mask"].sum())
        return timing

    def _attention(
        self, module: torch.nn.Module, dtype: torch.dtype, data: DataProto
    ) -> contextlib.AbstractContextManager:
        """The SDPA backend the workers' updates use (``workers.compute.attention``)."""
        return attention.sdpa_backend(module, self.device, dtype, data.batch["input_ids"].shape[1])

    def _generate(self, prompts: DataProto) -> DataProto:
        """Sample responses with the rollout settings; the prompts' non-tensor fields (reward inputs) carry over."""
        rollout = self.rollout
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.actor.module.eval()
        with lora.merged_adapters(self.actor.module):  # as the workers sample
            out = generate_sequences(
                self.actor.module,
                *(prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids")),
                response_length=int(rollout.response_length),
                eos_token_id=self.eos_ids,
                pad_token_id=pad,
                temperature=rollout.temperature,
                top_p=rollout.top_p,
                top_k=rollout.top_k,
                do_sample=rollout.do_sample,
                return_log_probs=rollout.calculate_log_probs,
                compile_decode=rollout.compile_decode,  # as the workers decode
            )
        return DataProto.from_dict({k: v.cpu() for k, v in out.items()}, non_tensors=dict(prompts.non_tensor_batch))


def _phase_timer(
    timing: dict[str, float], device: torch.device, phases: PhasePeaks | None = None
) -> Callable[[str], contextlib.AbstractContextManager]:
    """``with timer(name):`` puts the block's seconds (GPU work included) in ``timing``, its peak RSS in ``phases``."""

    @contextlib.contextmanager
    def timer(name: str) -> Iterator[None]:
        perf.synchronize(device)
        if phases is not None:
            phases.enter(name)
        start = time.perf_counter()
        yield
        perf.synchronize(device)
        timing[name] = time.perf_counter() - start
        if phases is not None:
            phases.enter("between")

    return timer
