"""A role's model on one worker: how it is sharded, and what a trained role carries around it.

``shard_role`` is the one place that decides how a model is placed: FSDP2 over all ranks, or, on a single rank,
no FSDP at all (fp32 as is; bf16 as a cast copy, over fp32 master weights when trained), except that a trained
bf16 role whose parameters are offloaded between phases keeps FSDP, which moves and casts them.
``TrainedRole`` holds a trained model with its optimizer, LR schedule, precision and FLOPs model, and gives the
actor and the critic their shared phases: onload/offload, a timed update with MFU, save and load.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from torch import nn

from single_controller.data_proto import DataProto
from workers.checkpoint import shards
from workers.compute import attention
from workers.parallel import fsdp
from workers.parallel.master_weights import MasterWeights, checkpointed, on_one_rank, optimizer_for
from workers.parallel.optim import build_lr_scheduler
from workers.runtime import perf


def shard_role(
    worker: Any, model: nn.Module, fsdp_config: Any, trained: bool = False
) -> tuple[nn.Module, MasterWeights | None]:
    """Move ``model`` to ``worker.device`` and place it in its configured precision; returns (the module to compute
    with, its ``MasterWeights`` or None).

    One rank has nothing to shard, and FSDP's per-forward casts and hooks would only cost time there
    (docs/benchmarks.md, "Precision"), so it runs without FSDP (``master_weights.on_one_rank``) unless a trained
    bf16 role is offloaded between phases: then FSDP keeps its fp32 parameters, in one group, and moves them.
    """
    model.to(worker.device)  # the default mesh then spans all ranks on this device type
    param_dtype, reduce_dtype = fsdp.role_precision(worker.device, fsdp_config.mixed_precision)
    offloaded_masters = trained and param_dtype is not None and fsdp_config.param_offload
    if worker.world_size == 1 and not offloaded_masters:
        return on_one_rank(model, param_dtype, trained)
    return fsdp.apply_fsdp(
        model,
        param_dtype=param_dtype,
        reduce_dtype=reduce_dtype,
        reshard_after_forward=fsdp_config.reshard_after_forward,
        min_num_params=fsdp_config.wrap_policy.min_num_params,
    ), None


class FrozenRole:
    """A model that only runs forwards (reference policy, reward model), offloaded between phases if configured."""

    def __init__(self, worker: Any, model: nn.Module, fsdp_config: Any) -> None:
        self.device = worker.device
        self.offload_params = fsdp_config.param_offload
        self.module, _ = shard_role(worker, model.requires_grad_(False).eval(), fsdp_config)
        if self.offload_params:
            fsdp.offload_fsdp_params(self.module)

    def onloaded(self) -> AbstractContextManager:
        return fsdp.onloaded(self.module, self.device, offload_params=self.offload_params)


class TrainedRole:
    """A trained model on one worker: the module (sharded by ``shard_role``), AdamW over it or its fp32 masters,
    the LR schedule, the compute dtype and the FLOPs model its MFU is measured with.

    ``fsdp_config`` and ``optim_config`` are the role's sections (e.g. ``actor_rollout_ref.actor.fsdp_config``);
    ``compile`` runs ``torch.compile`` on the module's forward (before the optimizer sees its parameters).
    """

    def __init__(
        self,
        worker: Any,
        model: nn.Module,
        fsdp_config: Any,
        optim_config: Any,
        total_training_steps: int,
        compile: bool = False,
    ) -> None:
        self.device = worker.device
        self.fsdp_config = fsdp_config
        self.module, self.weights = shard_role(worker, model, fsdp_config, trained=True)
        self.flops = perf.FlopsModel.of(self.module)
        self.dtype = fsdp.compute_dtype(self.device, fsdp_config.mixed_precision)
        if compile:  # in place: every forward of the module compiles (rollout, log-probs, update)
            self.module.compile()
        self.optimizer = optimizer_for(self.module, self.weights, optim_config)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, optim_config, total_training_steps)
        if fsdp_config.param_offload:
            fsdp.offload_fsdp_params(self.module)
        if fsdp_config.optimizer_offload:
            fsdp.offload_optimizer(self.optimizer)

    def onloaded(self, with_optimizer: bool = False) -> AbstractContextManager:
        """Parameters (and with ``with_optimizer`` the optimizer state) on the device for one phase."""
        return fsdp.onloaded(
            self.module,
            self.device,
            self.optimizer,
            offload_params=self.fsdp_config.param_offload,
            offload_optimizer_state=self.fsdp_config.optimizer_offload and with_optimizer,
        )

    def update(
        self,
        name: str,
        data: DataProto,
        run: Callable[[], dict[str, list[float]]],
        epochs: int,
        reference_forward: bool = False,
        also_onloaded: AbstractContextManager | None = None,
    ) -> DataProto:
        """Run ``run()`` (the role's update on ``data``) onloaded and timed; its metrics plus ``perf/mfu/<name>``,
        the peak and memory metrics and ``timing_s/worker_update_<name>``, as the driver expects them."""
        start = time.perf_counter()
        width = data.batch["input_ids"].shape[1]
        with (
            self.onloaded(with_optimizer=True),
            also_onloaded or nullcontext(),
            attention.sdpa_backend(self.module, self.device, self.dtype, width),
        ):
            metrics = run()
        seconds = time.perf_counter() - start
        flops = self.flops.update_flops(data.batch["attention_mask"].sum(-1), epochs, reference_forward)
        peak, _ = perf.peak_flops(self.device, self.dtype)  # against the peak of the dtype it computes in
        extra = {
            f"perf/mfu/{name}": perf.mfu(flops, seconds, peak),
            "perf/peak_tflops": peak / 1e12,
            **perf.memory_metrics(self.device),
            f"timing_s/worker_update_{name}": seconds,
        }
        metrics.update({k: [v] for k, v in extra.items()})
        return DataProto(meta_info={"metrics": metrics})

    def save(self, path: str, tokenizer: Any) -> None:
        """An HF model directory plus optimizer, scheduler and RNG state under ``path`` (fp32 masters if any)."""
        with self.onloaded(with_optimizer=True):
            shards.save_role(
                path, checkpointed(self.module, self.weights), self.optimizer, self.lr_scheduler, tokenizer
            )

    def load(self, path: str) -> None:
        """Restore what ``save`` wrote, from any world size."""
        with self.onloaded(with_optimizer=True):
            shards.load_role(path, checkpointed(self.module, self.weights), self.optimizer, self.lr_scheduler)
