"""The PPO actor on one data-parallel rank: log-probs of responses and the clipped policy-gradient update.

Works on any ``nn.Module`` causal LM: an FSDP2-sharded one (gradients are then averaged over ranks by the
reduce-scatter in backward) or a plain one (a world of one process).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from algos import aggregate, compute_policy_loss, kl_penalty
from algos.distillation import combine_with_policy_loss, distillation_loss, distillation_token_losses
from config.distillation import uses_topk
from planner.phases import forward_keys, uses_full_kl
from planner.plan import is_single_step
from single_controller.data_proto import DataProto
from workers.compute.logprob import token_stats
from workers.compute.packing import restore_order
from workers.compute.update import configured_update, micro_batches, model_device, to_device


class DataParallelPPOActor:
    """Computes log-probs and runs PPO updates for ``module`` on this rank's share of the batch.

    Args:
        module: the policy (sharded with ``workers.parallel.fsdp.apply_fsdp`` or plain).
        optimizer / lr_scheduler: None for a frozen reference policy.
        config: the ``actor_rollout_ref.actor`` config (``use_dynamic_bsz`` / ``ppo_max_token_len_per_gpu``
            set the update's micro-batches).
        mini_batch_size: samples per optimizer step on this rank (the worker computes it from the global
            ``ppo_mini_batch_size``·n / world size); None means ``config.ppo_mini_batch_size`` as is.
        use_remove_padding: run every forward on packed rows (``actor_rollout_ref.model.use_remove_padding``).
        use_fused_kernels: log-probs, entropies and the exact KL from hidden states in chunks of tokens, never the
            full-vocabulary logits (``actor_rollout_ref.model.use_fused_kernels``; ``workers.compute.logprob``).
        use_prefix_grouper: the rows of a micro-batch that repeat a prompt run it once, in packed rows
            (``actor_rollout_ref.actor.use_prefix_grouper``; ``packing.PromptUnits``).
        ref_module: the frozen reference policy in this process; needed only by ``kl_loss_type=full``, whose
            exact KL compares the two models' whole next-token distributions inside the update. A LoRA
            ``module`` may be its own reference: it then runs with its adapters disabled.
        distillation: the ``distillation`` section when on-policy distillation is on (else None): the update reads
            the teachers' scores (``workers.compute.teacher``) and its loss gains the distillation loss
            (``algos.distillation``), added to the policy loss or replacing it.
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
        use_fused_kernels: bool = True,
        use_prefix_grouper: bool = False,
        distillation: Any = None,
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
        self.use_fused_kernels = use_fused_kernels
        self.use_prefix_grouper = use_prefix_grouper
        self.distillation = distillation

    def forward_log_prob(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor | None,
        response_length: int,
        temperature: float = 1.0,
        calculate_entropy: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """log π(response token) (B, R) and optionally the entropy (B, R) of the temperature-scaled policy.

        The response is the last ``response_length`` tokens of ``input_ids``; sampling used the same temperature.
        Positions without a valid response token (``attention_mask`` 0) are 0; with remove-padding
        ``position_ids`` is not read.
        """
        micro = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        stats = self._token_stats(micro, response_length, temperature, ("entropy",) if calculate_entropy else ())
        return stats["log_probs"], stats.get("entropy")

    def _token_stats(
        self,
        micro: dict[str, Tensor],
        response_length: int,
        temperature: float,
        stats: tuple[str, ...],
        ref_module: nn.Module | None = None,
        entropy_grad: bool = True,
        topk_ids: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """``log_probs`` (B, R) plus the per-position statistics named in ``stats`` (``workers.compute.logprob.STATS``),
        with ``ref_module`` the exact KL to it (``kl``), with ``topk_ids`` (B, R, k) the log-probs at those ids
        (``topk_log_probs``)."""
        return token_stats(
            self.module,
            micro,
            response_length,
            temperature,
            self.use_remove_padding,
            self.use_fused_kernels,
            stats,
            ref_module,
            entropy_grad,
            self.use_prefix_grouper,
            topk_ids,
        )

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
        stats = self.compute_token_stats(
            data, micro_batch_size, temperature, max_token_len, ("entropy",) if calculate_entropy else ()
        )
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
        """``compute_log_prob``'s log-probs plus the statistics named in ``stats`` (``workers.compute.logprob.STATS``),
        each (B, R), on CPU: one copy from the device per step (``device_token_stats``)."""
        return {
            name: value.cpu()
            for name, value in self.device_token_stats(
                data, micro_batch_size, temperature, max_token_len, stats
            ).items()
        }

    @torch.no_grad()
    def device_token_stats(
        self,
        data: DataProto,
        micro_batch_size: int,
        temperature: float = 1.0,
        max_token_len: int | None = None,
        stats: tuple[str, ...] = (),
    ) -> dict[str, Tensor]:
        """``compute_token_stats`` left on the model's device (no read from it inside the micro-batch loop)."""
        self.module.eval()
        tensors = {k: data.batch[k] for k in forward_keys(self.use_remove_padding)}
        response_length = tensors["responses"].shape[-1]
        device = model_device(self.module)
        chunks: dict[str, list[Tensor]] = {name: [] for name in ("log_probs", *stats)}
        indices = micro_batches(self.module, tensors, micro_batch_size, max_token_len)
        for index in indices:
            micro = to_device(tensors, index, device)
            for name, value in self._token_stats(micro, response_length, temperature, stats).items():
                chunks[name].append(value)
        return {name: restore_order(values, indices) for name, values in chunks.items()}

    def _micro_loss(
        self, micro: dict[str, Tensor], temperature: float, global_batch: dict[str, float]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The PPO objective on one micro-batch: pg loss − entropy_coeff·entropy (+ kl_loss_coef·KL to the ref),
        each term this micro-batch's share of the mini-batch's (``global_batch``: see ``algos.aggregate``); with
        distillation, combined with the distillation loss (``_with_distillation``)."""
        cfg = self.config
        # the top-k distillation loss reads the student's log-probs at the teacher's top-k ids, from this forward
        topk = self.distillation is not None and uses_topk(self.distillation)
        topk_ids = micro["teacher_topk_ids"] if topk else None
        mask = micro["response_mask"].to(torch.float32)
        # kl_loss_type=full compares the two models' whole distributions on the same rows (a LoRA actor is its
        # own reference); the entropy is always logged, but keeps a graph only when it is part of the loss
        stats = self._token_stats(
            micro,
            micro["responses"].shape[-1],
            temperature,
            ("entropy",),
            ref_module=self.ref_module if uses_full_kl(cfg) else None,
            entropy_grad=cfg.entropy_coeff != 0,
            topk_ids=topk_ids,
        )
        log_prob = stats["log_probs"]
        # on-policy (no old_log_probs sent): this forward is the policy that sampled, so ratio = 1
        old_log_prob = micro["old_log_probs"] if "old_log_probs" in micro else log_prob.detach()
        pg_loss, metrics = compute_policy_loss(
            cfg.policy_loss.loss_mode,
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=micro["advantages"],
            response_mask=mask,
            loss_agg_mode=cfg.loss_agg_mode,
            config=cfg,
            rollout_log_probs=micro.get("rollout_log_probs"),
            global_batch=global_batch,
        )
        agg = (cfg.loss_agg_mode, cfg.loss_scale_factor, global_batch)
        with torch.set_grad_enabled(cfg.entropy_coeff != 0):
            entropy, metrics["actor/entropy"] = aggregate(stats["entropy"], mask, *agg)
        loss = pg_loss - cfg.entropy_coeff * entropy if cfg.entropy_coeff != 0 else pg_loss
        if cfg.use_kl_loss:
            kl = stats["kl"] if "kl" in stats else kl_penalty(log_prob, micro["ref_log_prob"], cfg.kl_loss_type)
            kl_loss, metrics["actor/kl_loss"] = aggregate(kl, mask, *agg)
            loss = loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_coef"] = torch.tensor(float(cfg.kl_loss_coef))
        if self.distillation is not None:
            loss = self._with_distillation(loss, micro, stats, old_log_prob, global_batch, metrics)
        return loss, metrics

    def _with_distillation(
        self,
        loss: Tensor,
        micro: dict[str, Tensor],
        stats: dict[str, Tensor],
        old_log_prob: Tensor,
        global_batch: dict[str, float],
        metrics: dict[str, Tensor],
    ) -> Tensor:
        """The actor's loss with the distillation loss: the per-token divergence to the teacher
        (``algos.distillation``) from this forward's log-probs and the teacher's, aggregated like the policy loss
        (or as PPO's clipped loss with it as the reward), then added to ``loss`` × ``distillation_loss_coef``
        (``use_task_rewards``) or in its place. Its metrics (``distillation/*``) go into ``metrics``."""
        cfg, mask = self.distillation.distillation_loss, micro["response_mask"].to(torch.float32)
        token_losses, token_metrics = distillation_token_losses(
            cfg.loss_mode,
            mask,
            student_log_probs=stats["log_probs"],
            teacher_log_probs=micro.get("teacher_log_probs"),
            student_topk_log_probs=stats.get("topk_log_probs"),
            teacher_topk_log_probs=micro.get("teacher_topk_log_probs"),
            log_prob_min_clamp=cfg.log_prob_min_clamp,
        )
        distill, loss_metrics = distillation_loss(
            token_losses,
            mask,
            cfg,
            self.config.loss_agg_mode,
            log_prob=stats["log_probs"],
            old_log_prob=old_log_prob,
            loss_scale_factor=self.config.loss_scale_factor,
            global_batch=global_batch,
        )
        metrics.update({**token_metrics, **loss_metrics})
        return combine_with_policy_loss(loss, distill, cfg)

    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """PPO update on this rank's rows: ``ppo_epochs`` × mini-batches, one optimizer step per mini-batch.

        Reads batch keys input_ids, attention_mask, position_ids (not with remove-padding), responses,
        response_mask, advantages, old_log_probs (+ ref_log_prob with ``use_kl_loss``, unless
        ``kl_loss_type=full``; + the policy loss's own needs, ``algos.POLICY_LOSSES``): the update_actor phase of
        ``planner.phases.declare_flows``, which the worker gives it exactly (other keys would be micro-batched
        along). ``meta_info["temperature"]`` (default 1) must be the sampling temperature. Without old_log_probs
        the update is on-policy: allowed only for a single optimizer step on unchanged weights (see
        :func:`is_single_step`), where the old log-probs equal this forward's, detached. The LR scheduler steps
        once per call, i.e. once per training step, so warm-up is counted in training steps.
        Returns metric name -> list of floats.
        """
        if self.optimizer is None:
            raise RuntimeError("update_policy needs an optimizer; this actor was built as a frozen reference")
        cfg = self.config
        temperature = float(data.meta_info.get("temperature", 1.0))
        rows, mini = len(data.batch["responses"]), self.mini_batch_size or cfg.ppo_mini_batch_size
        if "old_log_probs" not in data.batch and not is_single_step(cfg.ppo_epochs, mini, rows):
            raise ValueError(
                f"update without old_log_probs is on-policy only for one optimizer step: "
                f"ppo_epochs={cfg.ppo_epochs}, mini-batch {mini} of {rows} rows"
            )
        return configured_update(
            self.module,
            self.optimizer,
            self.lr_scheduler,
            dict(data.batch),
            lambda micro, global_batch: self._micro_loss(micro, temperature, global_batch),
            cfg,
            self.mini_batch_size,
            prefix="actor",
        )
