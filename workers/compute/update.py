"""The update loop shared by the actor and the critic: micro-batching, mini-batch steps, one LR step per call."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from algos.host_sync import host_read
from workers.compute.packing import micro_batch_indices, mini_batch_totals
from workers.parallel.fsdp import clip_grad_norm_, is_fsdp

# (micro-batch on the model's device, the mini-batch's agg_loss keywords: BatchTotals.global_batch) ->
# (the micro-batch's share of the mini-batch's loss, metrics as scalar tensors)
LossFn = Callable[[dict[str, Tensor], dict[str, float]], tuple[Tensor, dict[str, Tensor]]]


def split_batch(tensors: dict[str, Tensor], size: int) -> list[dict[str, Tensor]]:
    """Split equal-length tensors along dim 0 into chunks of ``size`` rows (the last chunk may be shorter)."""
    if size <= 0:
        raise ValueError(f"micro/mini-batch size must be positive, got {size}")
    n = next(iter(tensors.values())).shape[0]
    return [{k: v[i : i + size] for k, v in tensors.items()} for i in range(0, n, size)]


def to_float_metrics(metrics: dict[str, list]) -> dict[str, list[float]]:
    """Lists of scalar tensors (or floats) -> lists of floats, with one device-to-host copy per metric."""
    out = {}
    for key, values in metrics.items():
        if all(isinstance(v, Tensor) for v in values):
            out[key] = torch.stack([v.detach().float() for v in values]).cpu().tolist()
        else:
            out[key] = [float(v) for v in values]
    return out


HOST_KEYS = ("input_ids", "attention_mask")  # a micro-batch's layout (packing, valid positions) is planned from these


def to_device(tensors: dict[str, Tensor], index: Tensor, device: torch.device) -> dict[str, Tensor]:
    """The rows ``index`` of ``tensors`` (the batch's, on the host) on ``device``, plus their host copies of
    ``HOST_KEYS`` as ``host_<key>``: the forward's layout is planned from those, with no read from the device."""
    micro = {k: v[index].to(device) for k, v in tensors.items()}
    micro.update({f"host_{k}": tensors[k][index] for k in HOST_KEYS if k in tensors})
    return micro


def model_device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


def _sync_device(module: nn.Module) -> torch.device | None:
    """Where the ranks of a sharded module exchange batch sizes; None for a plain module (nothing to agree on)."""
    return model_device(module) if is_fsdp(module) else None


def micro_batches(
    module: nn.Module, tensors: dict[str, Tensor], micro_batch_size: int, max_token_len: int | None = None
) -> list[Tensor]:
    """Row indices of each micro-batch (see ``packing.micro_batch_indices``); FSDP ranks agree on their number."""
    return micro_batch_indices(tensors["attention_mask"], micro_batch_size, max_token_len, _sync_device(module))


def minibatch_update(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    tensors: dict[str, Tensor],
    loss_fn: LossFn,
    *,
    mini_batch_size: int,
    micro_batch_size: int,
    epochs: int,
    shuffle: bool,
    grad_clip: float,
    prefix: str,
    max_token_len: int | None = None,
) -> dict[str, list]:
    """``epochs`` passes over mini-batches; one optimizer step per mini-batch, accumulated over micro-batches.

    Micro-batches hold ``micro_batch_size`` rows, or (``max_token_len`` set: dynamic batch size) as many rows
    as fit that many valid tokens. ``loss_fn`` gets the mini-batch's totals over all ranks and returns each
    micro-batch's share of the mini-batch's loss (``algos.agg_loss``), so the accumulated, FSDP-averaged
    gradient is that of the whole global mini-batch's loss however it was split. A mini-batch whose clipped
    gradient norm is not finite is skipped (its gradients dropped). Metrics: the loss_fn's, once per
    micro-batch, plus ``{prefix}/grad_norm``, ``{prefix}/lr`` and ``{prefix}/nonfinite_skipped`` (1 for a skipped
    mini-batch) once per mini-batch.
    """
    metrics: dict[str, list] = defaultdict(list)
    device = model_device(module)
    module.train()
    for epoch in range(epochs):
        if shuffle:  # seeded by the epoch, so a run is reproducible
            n = next(iter(tensors.values())).shape[0]
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(epoch))
            epoch_tensors = {k: v[perm] for k, v in tensors.items()}
        else:
            epoch_tensors = tensors
        for mini in split_batch(epoch_tensors, mini_batch_size):
            global_batch = mini_batch_totals(mini["response_mask"], _sync_device(module)).global_batch()
            for index in micro_batches(module, mini, micro_batch_size, max_token_len):
                micro = to_device(mini, index, device)
                loss, micro_metrics = loss_fn(micro, global_batch)
                loss.backward()
                for key, value in micro_metrics.items():
                    metrics[key].append(value)
            grad_norm = clip_grad_norm_(optimizer, grad_clip)
            finite = host_read("update.grad_norm_finite", torch.isfinite(grad_norm), meta_value=True)
            if finite:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            metrics[f"{prefix}/grad_norm"].append(grad_norm.detach())
            metrics[f"{prefix}/nonfinite_skipped"].append(0.0 if finite else 1.0)
            metrics[f"{prefix}/lr"].append(optimizer.param_groups[0]["lr"])
    return metrics


def configured_update(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: Any,
    tensors: dict[str, Tensor],
    loss_fn: LossFn,
    config: Any,
    mini_batch_size: int | None,
    prefix: str,
) -> dict[str, list[float]]:
    """:func:`minibatch_update` with an actor/critic config's settings, then one LR-scheduler step.

    The scheduler steps once per call, i.e. once per training step, so warm-up is counted in
    training steps. Returns metric name -> list of floats.
    """
    metrics = minibatch_update(
        module,
        optimizer,
        tensors,
        loss_fn,
        mini_batch_size=mini_batch_size or config.ppo_mini_batch_size,
        micro_batch_size=config.ppo_micro_batch_size_per_gpu,
        epochs=config.ppo_epochs,
        shuffle=config.shuffle,
        grad_clip=config.grad_clip,
        prefix=prefix,
        max_token_len=config.ppo_max_token_len_per_gpu if config.use_dynamic_bsz else None,
    )
    if lr_scheduler is not None:
        lr_scheduler.step()
    return to_float_metrics(metrics)
