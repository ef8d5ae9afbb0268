"""Model FLOPs utilisation and memory: the ``perf/mfu/*`` and ``perf/*memory*`` metrics of the workers.

MFU = model FLOPs of the work done / (seconds × the device's peak FLOP/s). Model FLOPs count what the model
needs, not what ran: padding, activation recomputation and re-read weights add time but no FLOPs, so they
lower MFU (the PaLM paper's appendix B; torchtitan counts the same way). Per token a forward pass
multiplies by every weight matrix once (2·N FLOPs, N = the matmul parameters) and, in each of L layers,
attends to the sequence's s tokens (QKᵀ and AV: 4·d_attn·s, non-causal, as PaLM counts). Backward is twice the
forward when every weight trains: the gradients of the activations (one forward's FLOPs) and of the weights
(2·N). Frozen weights (LoRA's base model) get no weight gradients, so their 2 FLOPs per weight and token drop.
"""

from __future__ import annotations

import functools
import resource
import time
from dataclasses import dataclass

import psutil
import torch
from torch import Tensor, nn

from workers.compute import attention

GiB = 2**30

# dense (no sparsity) bf16 tensor-core peak, FLOP/s, by CUDA device name; the first matching entry wins
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H200", 989e12),
    ("H800", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)


@dataclass(frozen=True)
class FlopsModel:
    """What a transformer's FLOPs per token depend on: matmul parameters, layers and attention width."""

    matmul_params: int  # N: weights a token is multiplied by (not the input embedding, a lookup)
    layers: int
    attn_dim: int  # query heads × head dim
    trained_params: int | None = None  # of the N, those whose weight gradients backward computes (None: all)

    @classmethod
    def of(cls, model: nn.Module) -> FlopsModel:
        """Read N, L and d_attn off an HF model (sharded or not: a DTensor's numel is the full tensor's)."""
        config = model.config
        heads, head_dim = config.num_attention_heads, attention.head_dim(model)
        try:
            embedding = model.get_input_embeddings().weight
        except (AttributeError, NotImplementedError):  # remote code without the accessor: count every matrix
            embedding = None
        output = model.get_output_embeddings()
        tied = embedding is not None and output is not None and output.weight is embedding  # lm_head multiplies
        matrices = [p for p in model.parameters() if p.dim() >= 2 and p is not embedding]
        matrices += [embedding] if tied else []
        return cls(
            sum(p.numel() for p in matrices),
            config.num_hidden_layers,
            heads * head_dim,
            trained_params=sum(p.numel() for p in matrices if p.requires_grad),
        )

    def forward_flops(self, seq_lens: Tensor) -> float:
        """FLOPs of one forward over sequences of ``seq_lens`` (B,) valid tokens: Σ_b 2·N·s_b + 4·L·d_attn·s_b²."""
        s = seq_lens.double()
        return float((2 * self.matmul_params * s + 4 * self.layers * self.attn_dim * s * s).sum())

    def train_flops(self, seq_lens: Tensor) -> float:
        """FLOPs of forward + backward: 3 × forward, less 2·(N − N_trained)·s_b for the frozen weights' gradients."""
        frozen = 0 if self.trained_params is None else self.matmul_params - self.trained_params
        return 3 * self.forward_flops(seq_lens) - float(2 * frozen * seq_lens.double().sum())

    def update_flops(self, seq_lens: Tensor, epochs: int = 1, reference_forward: bool = False) -> float:
        """A PPO update: per epoch forward + backward, plus the reference model's forward where the loss reads it."""
        return epochs * (self.train_flops(seq_lens) + reference_forward * self.forward_flops(seq_lens))


def peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """(peak FLOP/s, where the figure comes from): the data sheet for a known GPU, else a measured matmul.

    A CPU has no data-sheet figure torch can read, so its peak is the best rate of a square ``dtype`` matmul
    on this process's threads: MFU on a CPU says how close the step comes to this machine's GEMM speed.
    """
    if device.type != "cuda":
        return measured_matmul_flops(device, dtype), f"measured {dtype} matmul, {torch.get_num_threads()} threads"
    name = torch.cuda.get_device_name(device)
    if dtype in (torch.bfloat16, torch.float16):
        for key, flops in PEAK_BF16_FLOPS:
            if key in name:
                return flops, f"datasheet bf16 dense, {name}"
    # an unlisted GPU: a matmul large enough to keep its tensor cores busy
    return measured_matmul_flops(device, dtype, size=8192), f"measured {dtype} matmul, {name}"


@functools.cache
def measured_matmul_flops(device: torch.device, dtype: torch.dtype, size: int = 1024, repeats: int = 5) -> float:
    """Best rate of ``repeats`` (size × size) @ (size × size) matmuls, FLOP/s (cached: measured once a process)."""
    # its own generator: a metric must not move the global RNG that sampling and resumed runs depend on
    a = torch.randn(size, size, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    best = float("inf")
    for _ in range(repeats + 1):  # the first one warms up
        synchronize(device)
        start = time.perf_counter()
        torch.mm(a, a)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work before reading a clock (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model FLOPs utilisation: flops / (seconds × peak)."""
    return flops / (seconds * peak) if seconds > 0 else 0.0


def peak_rss_bytes() -> int:
    """This process's highest resident set size so far: the kernel's VmHWM, or ``ru_maxrss`` without procfs.

    VmHWM first: ``ru_maxrss`` keeps the peak from before an ``exec``, so a process spawned from a big parent
    would report the parent's (and it counts KiB on Linux, bytes on macOS, which has no procfs).
    """
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def memory_metrics(device: torch.device) -> dict[str, float]:
    """``perf/cpu_memory_used_gb`` (this process's resident memory now), ``perf/cpu_memory_peak_gb`` (its highest
    so far) and, on CUDA, the allocator's peaks (GiB)."""
    metrics = {
        "perf/cpu_memory_used_gb": psutil.Process().memory_info().rss / GiB,
        "perf/cpu_memory_peak_gb": peak_rss_bytes() / GiB,
    }
    if device.type == "cuda":
        metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / GiB
        metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(device) / GiB
    return metrics
