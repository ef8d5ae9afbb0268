"""The PPO actor on one data-parallel rank: log-probs of responses and the clipped policy-gradient update.

Works on any ``nn.Module`` causal LM: an FSDP2-sharded one (gradients are then averaged over ranks by the
reduce-scatter in backward) or a plain one (a world of one process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from algos import (
    aggregate,
    compute_policy_loss,
    entropy_from_logits,
    kl_full,
    kl_penalty,
    logprobs_from_logits,
    sum_pi_squared_from_logits,
)
from config.plan import LOG_PROB_KEYS, actor_update_keys, is_single_step, uses_full_kl
from single_controller import DataProto
from workers.lora import as_reference
from workers.packing import pack_batch, pack_width, restore_order
from workers.update import configured_update, micro_batches, model_device

# per-position statistics of the policy a log-prob forward can return beside the log-probs: logits (..., V) -> (...)
TOKEN_STATS: dict[str, Callable[[Tensor], Tensor]] = {
    "entropy": entropy_from_logits,
    "sum_pi_squared": sum_pi_squared_from_logits,
}


def response_logits(
    module: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    response_length: int,
    temperature: float = 1.0,
) -> Tensor:
    """fp32 logits / temperature (B, R, V) at the positions that predict each response token (-R-1 .. -2).

    Only the last R+1 positions go through the LM head (``logits_to_keep``), which matters for large vocabularies.
    """
    logits = module(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        logits_to_keep=response_length + 1,
    ).logits
    return logits[:, :-1].float() / temperature


def response_token_logits(
    module: nn.Module, micro: dict[str, Tensor], response_length: int, temperature: float, remove_padding: bool
) -> tuple[Tensor, Tensor, Callable[[Tensor], Tensor]]:
    """(logits (..., V) fp32 / temperature, the response tokens they predict (...), unpack: (...) -> (B, R)).

    Padded: (B, R, V), unpack is the identity. Remove-padding: only the N valid response tokens, (N, V), from
    packed rows (``packing.pack_batch``); unpack scatters per-token values back to (B, R) with zeros elsewhere.
    """
    input_ids = micro["input_ids"]
    if not remove_padding:
        logits = response_logits(
            module, input_ids, micro["attention_mask"], micro["position_ids"], response_length, temperature
        )
        return logits, input_ids[:, -response_length:], lambda values: values
    mask = micro["attention_mask"]
    packed = pack_batch(input_ids, mask, response_length, pack_width(module, mask))
    logits = module(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        use_cache=False,
        logits_to_keep=packed.keep_columns,
    ).logits
    return packed.gather(logits).float() / temperature, packed.labels, packed.unpack


class DataParallelPPOActor:
    """Computes log-probs and runs PPO updates for ``module`` on this rank's share of the batch.

    Args:
        module: the policy (sharded with ``workers.fsdp.apply_fsdp`` or plain).
        optimizer / lr_scheduler: None for a frozen reference policy.
        config: the ``actor_rollout_ref.actor`` config (``use_dynamic_bsz`` / ``ppo_max_token_len_per_gpu``
            set the update's micro-batches).
        mini_batch_size: samples per optimizer step on this rank (the worker computes it from the global
            ``ppo_mini_batch_size``·n / world size); None means ``config.ppo_mini_batch_size`` as is.
        use_remove_padding: run every forward on packed rows (``actor_rollout_ref.model.use_remove_padding``).
        ref_module: the frozen reference policy in this process; needed only by ``kl_loss_type=full``, whose
            exact KL compares the two models' whole next-token distributions inside the update. A LoRA
            ``module`` may be its own reference: it then runs with its adapters disabled.
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        config: Any,
        mini_batch_size: int | None = None,
        use_remove_padding: bool = False,
        ref_module: nn.Module | None = None,
    ) -> None:
        if uses_full_kl(config) and optimizer is not None and ref_module is None:
            raise ValueError("actor.kl_loss_type=full needs the reference model in the actor's process (ref_module)")
        self.module = module
        self.ref_module = ref_module
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.config = config
        self.mini_batch_size = mini_batch_size
        self.use_remove_padding = use_remove_padding

    def forward_log_prob(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        response_length: int,
        temperature: float = 1.0,
        calculate_entropy: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """log π(response token) (B, R) and optionally the entropy (B, R) of the temperature-scaled policy.

        The response is the last ``response_length`` tokens of ``input_ids``; sampling used the same temperature.
        With remove-padding, positions without a valid response token are 0.
        """
        micro = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        stats = self._token_stats(micro, response_length, temperature, ("entropy",) if calculate_entropy else ())
        return stats["log_probs"], stats.get("entropy")

    def _token_stats(self, micro: dict[str, Tensor], response_length: int, temperature: float,
                     stats: tuple[str, ...]) -> dict[str, Tensor]:
        """``log_probs`` (B, R) plus the per-position statistics of the policy named in ``stats`` (TOKEN_STATS)."""
        logits, labels, unpack = response_token_logits(
            self.module, micro, response_length, temperature, self.use_remove_padding
        )
        return {"log_probs": unpack(logprobs_from_logits(logits, labels)),
                **{name: unpack(TOKEN_STATS[name](logits)) for name in stats}}

    @torch.no_grad()
    def compute_log_prob(
        self,
        data: DataProto,
        micro_batch_size: int,
        temperature: float = 1.0,
        calculate_entropy: bool = False,
        max_token_len: int | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (B, R) of ``data.batch["responses"]`` and entropies (B, R) or None, on CPU, in row order.

        Micro-batches of ``micro_batch_size`` rows, or of at most ``max_token_len`` valid tokens when it is set.
        """
        stats = self.compute_token_stats(data, micro_batch_size, temperature, max_token_len,
                                         ("entropy",) if calculate_entropy else ())
        return stats["log_probs"], stats.get("entropy")

    @torch.no_grad()
    def compute_token_stats(
        self,
        data: DataProto,
        micro_batch_size: int,
        temperature: float = 1.0,
        max_token_len: int | None = None,
        stats: tuple[str, ...] = (),
    ) -> dict[str, Tensor]:
        """``compute_log_prob``'s log-probs plus the statistics named in ``stats`` (``TOKEN_STATS``), each (B, R)."""
        self.module.eval()
        tensors = {k: data.batch[k] for k in LOG_PROB_KEYS}
        response_length = tensors["responses"].shape[-1]
        device = model_device(self.module)
        chunks: dict[str, list[Tensor]] = {name: [] for name in ("log_probs", *stats)}
        indices = micro_batches(self.module, tensors, micro_batch_size, max_token_len)
        for index in indices:
            micro = {k: v[index].to(device) for k, v in tensors.items()}
            for name, value in self._token_stats(micro, response_length, temperature, stats).items():
                chunks[name].append(value.cpu())
        return {name: restore_order(values, indices) for name, values in chunks.items()}

    def _micro_loss(self, micro: dict[str, Tensor], temperature: float, global_batch: dict[str, float]
                    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The PPO objective on one micro-batch: pg loss − entropy_coeff·entropy (+ kl_loss_coef·KL to the ref),
        each term this micro-batch's share of the mini-batch's (``global_batch``: see ``algos.aggregate``)."""
        cfg = self.config
        response_length = micro["responses"].shape[-1]
        mask = micro["response_mask"].to(torch.float32)
        logits, labels, unpack = response_token_logits(
            self.module, micro, response_length, temperature, self.use_remove_padding
        )
        log_prob = unpack(logprobs_from_logits(logits, labels))
        pg_loss, metrics = compute_policy_loss(
            cfg.policy_loss.loss_mode,
            # on-policy (no old_log_probs sent): this forward is the policy that sampled, so ratio = 1
            old_log_prob=micro["old_log_probs"] if "old_log_probs" in micro else log_prob.detach(),
            log_prob=log_prob,
            advantages=micro["advantages"],
            response_mask=mask,
            loss_agg_mode=cfg.loss_agg_mode,
            config=cfg,
            rollout_log_probs=micro.get("rollout_log_probs"),
            global_batch=global_batch,
        )
        agg = (cfg.loss_agg_mode, cfg.loss_scale_factor, global_batch)
        # the entropy is always logged, but keeps its (B, R, V) graph only when it is part of the loss
        with torch.set_grad_enabled(cfg.entropy_coeff != 0):
            entropy, metrics["actor/entropy"] = aggregate(unpack(entropy_from_logits(logits)), mask, *agg)
        loss = pg_loss - cfg.entropy_coeff * entropy
        if cfg.use_kl_loss:
            kl_loss, metrics["actor/kl_loss"] = aggregate(self._kl(micro, logits, log_prob, unpack, temperature),
                                                          mask, *agg)
            loss = loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_coef"] = torch.tensor(float(cfg.kl_loss_coef))
        return loss, metrics

    def _kl(self, micro: dict[str, Tensor], logits: Tensor, log_prob: Tensor, unpack: Callable, temperature: float):
        """Per-token KL(π ‖ π_ref) (B, R) for the KL loss: a sampled-token estimator, or exact over the vocab."""
        if not uses_full_kl(self.config):
            return kl_penalty(log_prob, micro["ref_log_prob"], self.config.kl_loss_type)
        # same packing as the actor's forward, so rows of the two logits line up; a LoRA actor is its own reference
        with torch.no_grad(), as_reference(self.ref_module):
            ref_logits, _, _ = response_token_logits(
                self.ref_module, micro, micro["responses"].shape[-1], temperature, self.use_remove_padding
            )
        return unpack(kl_full(logits, ref_logits))

    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """PPO update on this rank's rows: ``ppo_epochs`` × mini-batches, one optimizer step per mini-batch.

        Needs batch keys input_ids, attention_mask, position_ids, responses, response_mask, advantages,
        old_log_probs (+ ref_log_prob with ``use_kl_loss``, unless ``kl_loss_type=full``);
        ``meta_info["temperature"]`` (default 1) must be the sampling temperature. Without old_log_probs the
        update is on-policy: allowed only for a single optimizer step on unchanged weights (see
        :func:`is_single_step`), where the old log-probs equal this forward's, detached. The LR scheduler
        steps once per call, i.e. once per training step (as verl does), so warm-up is counted in training
        steps. Returns metric name -> list of floats.
        """
        if self.optimizer is None:
            raise RuntimeError("update_policy needs an optimizer; this actor was built as a frozen reference")
        cfg = self.config
        temperature = float(data.meta_info.get("temperature", 1.0))
        rows, mini = len(data.batch["responses"]), self.mini_batch_size or cfg.ppo_mini_batch_size
        keys = actor_update_keys(cfg, old_log_probs="old_log_probs" in data.batch)
        if "old_log_probs" not in data.batch and not is_single_step(cfg.ppo_epochs, mini, rows):
            raise ValueError(f"update without old_log_probs is on-policy only for one optimizer step: "
                             f"ppo_epochs={cfg.ppo_epochs}, mini-batch {mini} of {rows} rows")
        return configured_update(
            self.module, self.optimizer, self.lr_scheduler, {k: data.batch[k] for k in keys},
            lambda micro, global_batch: self._micro_loss(micro, temperature, global_batch), cfg,
            self.mini_batch_size, prefix="actor",
        )
