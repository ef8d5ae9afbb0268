"""Does a run fit its device: the memory one worker may use (host RAM or the cgroup's limit shared by a node's
workers, each GPU's memory on CUDA), the keys that would bring an estimate's peak down, and the one-line refusal of
a run whose estimated peak exceeds the limit (``trainer.check_memory``, checked before any model loads)."""

from __future__ import annotations

import psutil
import torch

from config import ConfigError, PPOConfig
from config.tree import ARR
from trainer.preflight.memory_estimate import GiB, MemoryEstimate


def memory_limit(device: str, workers_per_node: int) -> tuple[int, str] | None:
    """(bytes one worker may use, what the limit is): host RAM (or the cgroup's limit) shared by the node's
    workers on a CPU; each GPU's memory on CUDA; None when no such device is here."""
    if device == "cuda":
        if not torch.cuda.is_available():
            return None
        total = torch.cuda.get_device_properties(0).total_memory
        return total, f"{total / GiB:.1f} GiB of GPU memory per worker"
    total = min(psutil.virtual_memory().total, _cgroup_limit())
    return total // workers_per_node, f"{total / GiB:.1f} GiB of host RAM for {workers_per_node} worker(s)"


def _cgroup_limit() -> int:
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            value = f.read().strip()
    except OSError:
        return 1 << 62
    return int(value) if value.isdigit() else 1 << 62


def lowering_keys(cfg: PPOConfig, estimate: MemoryEstimate) -> list[str]:
    """The keys that would bring the peak phase down: for each of its large terms (15 % of it or more), largest
    first."""
    peak, arr = estimate.peak, cfg.actor_rollout_ref
    keys: list[str] = []
    large = [t for t in sorted(peak.terms, key=lambda t: -peak.terms[t]) if peak.terms[t] >= 0.15 * peak.total]
    for term in large:
        if term in ("activations", "logits") and peak.key:
            keys.append(f"{peak.key} (lower)")
        if (
            term == "activations"
            and peak.name.startswith("update")
            and peak.activations_other is not None
            and peak.activations_other < peak.terms["activations"]
        ):
            model = "critic.model" if peak.name == "update_critic" else f"{ARR}.model"
            keys.append(f"{model}.enable_gradient_checkpointing=true")
        if term == "kv_cache":
            keys.append(
                "data.val_batch_size (lower)"
                if peak.name == "validate"
                else f"data.train_batch_size or {ARR}.rollout.n or data.max_response_length (lower)"
            )
        if term in ("weights", "gradients", "optimizer"):
            if arr.model.lora_rank == 0:
                keys.append(f"{ARR}.model.lora_rank (LoRA trains adapters only)")
            if estimate.device == "cuda":
                keys += [
                    "trainer.n_gpus_per_node (more GPUs shard the model)",
                    "fsdp_config.param_offload / optimizer_offload=true (per role)",
                ]
        if term == "runtime":
            keys.append("trainer.n_gpus_per_node (fewer workers per node)")
    return list(dict.fromkeys(keys))


def check_memory(cfg: PPOConfig, estimate: MemoryEstimate) -> None:
    """ConfigError (one line: the estimate, the limit, the keys) when the peak per worker exceeds the device."""
    limit = memory_limit(estimate.device, cfg.trainer.n_gpus_per_node)
    peak = estimate.peak
    if limit is None or peak.total <= limit[0]:
        return
    largest = max(peak.terms, key=lambda t: peak.terms[t])
    raise ConfigError(
        f"the estimated peak memory per worker, {peak.total / GiB:.1f} GiB in {peak.name} (largest: {largest} "
        f"{peak.terms[largest] / GiB:.1f} GiB), exceeds {limit[1]}; to bring it down: "
        f"{', '.join(lowering_keys(cfg, estimate))}. trainer.dry_run=true shows the breakdown; "
        "trainer.check_memory=false skips this check"
    )


def verdict(cfg: PPOConfig, estimate: MemoryEstimate) -> str:
    """The dry run's last line on memory: the peak per worker, and whether it fits this machine's device."""
    peak = estimate.peak
    limit = memory_limit(estimate.device, cfg.trainer.n_gpus_per_node)
    head = f"peak: {peak.total / GiB:.2f} GiB per worker in {peak.name}"
    if limit is None:
        return f"{head}; no {estimate.device} device here to compare with"
    if peak.total <= limit[0]:
        return f"{head}; fits {limit[1]}"
    return f"{head}; does NOT fit {limit[1]}: lower {', '.join(lowering_keys(cfg, estimate))}"
