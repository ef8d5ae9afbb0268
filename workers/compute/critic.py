"""The PPO critic on one data-parallel rank: a causal-LM backbone with a scalar value head.

The value model is ``AutoModelForTokenClassification(num_labels=1)`` loaded from a causal-LM checkpoint: the
backbone weights are shared with the policy checkpoint, the head (``score``) is new and starts at zero, so
the first values are 0 and the first updates move the head before they move the backbone.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForTokenClassification

from algos import compute_value_loss
from planner.phases import forward_keys
from single_controller.data_proto import DataProto
from workers.compute.packing import pack_batch, pack_width, restore_order
from workers.compute.update import configured_update, micro_batches, model_device, to_device

HEAD_PREFIXES = ("score.", "classifier.")  # token-classification head names in HF models


def load_value_model(path: str, trust_remote_code: bool = False, override_config: dict | None = None) -> nn.Module:
    """fp32 value model from an HF checkpoint, its config's attributes replaced by ``override_config``
    (``critic.model.override_config``); a freshly created head is zero-initialised (values start at 0)."""
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, **(override_config or {}))
    config.num_labels = 1
    config.classifier_dropout = 0.0  # values must not differ between compute_values and update_critic
    model, info = AutoModelForTokenClassification.from_pretrained(
        path,
        config=config,
        dtype=torch.float32,
        trust_remote_code=trust_remote_code,
        output_loading_info=True,
    )
    # a checkpoint that already holds a trained head (a saved critic) keeps it
    missing = set(info["missing_keys"])
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in missing and name.startswith(HEAD_PREFIXES):
                param.zero_()
    return model


def response_values(
    module: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor | None,
    response_length: int,
    remove_padding: bool = False,
    host_attention_mask: Tensor | None = None,
    host_input_ids: Tensor | None = None,
) -> Tensor:
    """Values (B, R) at the positions that predict each response token, i.e. the states before each action.

    With ``remove_padding`` the valid tokens run as packed rows (``position_ids`` is not read) and positions
    without a valid response token are 0. The packing is planned from ``host_input_ids`` / ``host_attention_mask``
    (the same rows on the host) when given: then nothing is read from the device.
    """
    if remove_padding:
        ids = input_ids if host_input_ids is None else host_input_ids
        mask = attention_mask if host_attention_mask is None else host_attention_mask
        packed = pack_batch(ids, mask, response_length, pack_width(module, mask)).to(input_ids.device)
        out = module(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False)
        return packed.unpack(out.logits.flatten(0, 1)[packed.predictors, 0].float())
    out = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return out.logits[:, -response_length - 1 : -1, 0].float()


class DataParallelPPOCritic:
    """Value estimates and clipped value-loss updates for ``module`` on this rank's share of the batch.

    ``config`` is the ``critic`` config (``model.use_remove_padding``, ``use_dynamic_bsz`` with
    ``forward_max_token_len_per_gpu`` / ``ppo_max_token_len_per_gpu``); ``mini_batch_size`` is samples per
    optimizer step on this rank (None: ``config.ppo_mini_batch_size`` as is).
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        config: Any,
        mini_batch_size: int | None = None,
    ) -> None:
        self.module = module
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.config = config
        self.mini_batch_size = mini_batch_size
        self.remove_padding = bool(config.model.use_remove_padding)

    def _values(self, micro: dict[str, Tensor], response_length: int) -> Tensor:
        return response_values(
            self.module,
            micro["input_ids"],
            micro["attention_mask"],
            micro.get("position_ids"),
            response_length,
            self.remove_padding,
            micro.get("host_attention_mask"),
            micro.get("host_input_ids"),
        )

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> Tensor:
        """Values (B, R) on CPU, zero outside ``response_mask``, in row order.

        Micro-batches of forward_micro_batch_size_per_gpu rows, or with ``use_dynamic_bsz`` of at most
        forward_max_token_len_per_gpu valid tokens; one copy from the device per call (``device_values``).
        """
        return self.device_values(data).cpu() * _response_mask(data, data.batch["responses"].shape[-1])

    @torch.no_grad()
    def device_values(self, data: DataProto) -> Tensor:
        """``compute_values``' values (B, R) on the model's device, not yet masked."""
        cfg = self.config
        self.module.eval()
        tensors = {k: data.batch[k] for k in forward_keys(self.remove_padding)}
        response_length = tensors["responses"].shape[-1]
        device = model_device(self.module)
        max_token_len = cfg.forward_max_token_len_per_gpu if cfg.use_dynamic_bsz else None
        indices = micro_batches(self.module, tensors, cfg.forward_micro_batch_size_per_gpu, max_token_len)
        values = []
        for index in indices:
            micro = to_device(tensors, index, device)
            values.append(self._values(micro, response_length))
        return restore_order(values, indices)

    def _micro_loss(self, micro: dict[str, Tensor], global_batch: dict[str, float]) -> tuple[Tensor, dict[str, Tensor]]:
        return compute_value_loss(
            vpreds=self._values(micro, micro["responses"].shape[-1]),
            returns=micro["returns"],
            values=micro["values"],
            response_mask=micro["response_mask"].to(torch.float32),
            cliprange_value=self.config.cliprange_value,
            loss_agg_mode=self.config.loss_agg_mode,
            loss_scale_factor=self.config.loss_scale_factor,
            global_batch=global_batch,
        )

    def update_critic(self, data: DataProto) -> dict[str, list[float]]:
        """Value-loss update: ``ppo_epochs`` × mini-batches, one optimizer step per mini-batch; LR scheduler once
        per call. Reads input_ids, attention_mask, position_ids, responses, response_mask, values, returns (the
        update_critic phase of ``planner.phases.declare_flows``; other keys given would be micro-batched along).
        Metrics: critic/vf_loss, critic/vf_clipfrac, critic/vpred_mean, critic/grad_norm, critic/lr."""
        cfg = self.config
        return configured_update(
            self.module,
            self.optimizer,
            self.lr_scheduler,
            dict(data.batch),
            self._micro_loss,
            cfg,
            self.mini_batch_size,
            prefix="critic",
        )


def _response_mask(data: DataProto, response_length: int) -> Tensor:
    if "response_mask" in data.batch:
        return data.batch["response_mask"].to(torch.float32)
    return data.batch["attention_mask"][:, -response_length:].to(torch.float32)
