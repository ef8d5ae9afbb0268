"""Peak memory per worker, estimated from the config and the models' configs: no weights, no Ray, no data.

Each term models what the workers' code does, its formula beside it (bytes; P parameters, W workers, c the compute
dtype's bytes, T tokens through the model, N response tokens, V the vocabulary, L layers):

- **weights**: every role on this worker. FSDP over W > 1 ranks keeps fp32 shards (4P/W) and gathers, in the
  compute dtype, one unit at a time for a forward plus the next (prefetch) and the root group (embeddings, LM head,
  final norm; never resharded after forward), and the whole model for generation (``fsdp.gathered_params``). One rank
  without FSDP holds the model as it is (4P), or in bf16 a cast copy beside fp32 masters when trained (6P,
  ``master_weights``), cast in place when frozen (2P). A LoRA actor is its own reference. Loading reads the full fp32
  model before it is sharded (4P of the largest role), onto the GPU on CUDA.
- **gradients**: fp32, of the trained parameters only (LoRA: the adapters), sharded like the weights, plus a unit's
  unsharded ones before they are reduce-scattered; they live during the update (``zero_grad(set_to_none)``).
- **optimizer**: AdamW's two fp32 moments per trained parameter, sharded, from the first update on.
- **activations**: what backward keeps per token and block of a Llama-style block (gated MLP), counted with
  saved-tensor hooks on Llama and Qwen2 blocks: ``6h + 2·kv + 4i`` values, ``+2h`` when the norms train (not under
  LoRA), ``+r`` per LoRA-adapted linear, ``+W`` for an explicit attention mask over rows of W tokens, ``+2·heads·W``
  under math attention (a bf16 CPU update of short rows, ``workers.compute.attention``); the norms keep their inputs in
  fp32. With gradient checkpointing a block keeps its input (h) and one block is recomputed at a time. On a CPU this is
  the resident memory too, with the workers' allocator (mimalloc, ``workers/runtime/malloc.py``); glibc's heap, the
  fallback where mimalloc is not installed, fragments (a peak 1.5–3× larger: docs/benchmarks.md), which the
  estimate does not model.
- **logits**: the LM head's output over the kept positions (``logits_to_keep``), its fp32 copy scaled by the
  temperature (N·V·4), logsumexp's temporary; in the update also the entropy's softmax and product and backward's
  gradients (4·N·V), as ``workers.compute.logprob`` computes them with fused kernels off; with them on
  (``model.use_fused_kernels``, the default) one chunk of tokens' logits (``algos.linear_logprob``) and its fp32
  temporaries, whatever N and V.
- **kv_cache**: the rollout's ``StaticCache``: 2·L·rows·kv·(prompt + response)·c for every row of the worker at once.
- **runtime**: on a CPU the worker process itself (Python, torch, transformers, Ray, gloo; ``RUNTIME_CPU_BYTES``,
  measured in docs/benchmarks.md), whose peak RSS the estimate is compared with; nothing on CUDA, whose
  ``max_memory_allocated`` counts tensors only.

The peak is the largest phase: what persists (weights, optimizer state, runtime) plus the phase's own.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from algos.linear_logprob import chunk_rows
from workers.compute import attention
from workers.compute.packing import PromptUnits, pack_batch, pack_width, takes_dense_mask
from workers.parallel import fsdp, lora

GiB = 2**30
FP32 = 4
# Measured (docs/benchmarks.md, "Memory estimate"): a CPU worker's RSS before any model
RUNTIME_CPU_BYTES = int(0.5 * GiB)
FUSED_TEMPORARIES = 4  # algos.linear_logprob's chunk: logits, probabilities, their product and the gradient
TERMS = ("weights", "gradients", "optimizer", "activations", "logits", "kv_cache", "runtime")


@dataclass(frozen=True)
class ModelSizes:
    """What a model's memory depends on, read off the model built on the meta device (no memory)."""

    params: int
    trained: int  # the optimizer's parameters: LoRA adapters, or all
    root: int  # outside the transformer blocks (FSDP's root group)
    unit: int  # the largest FSDP unit (blocks grouped by wrap_policy.min_num_params)
    layers: int
    hidden: int
    intermediate: int
    kv_dim: int  # key/value heads × head dim
    heads: int
    vocab: int
    adapter_width: int  # Σ LoRA rank over a block's adapted linears (0 without LoRA)
    merged: int  # weights of the linears that LoRA sampling merges into a copy (``lora.merged_adapters``)
    module: nn.Module = field(repr=False, compare=False)  # the meta model, for the packing code's own choices

    @property
    def norms_trained(self) -> bool:
        return self.trained == self.params


def model_sizes(config: Any, lora_config: Any = None, min_num_params: int = 0, value_head: bool = False) -> ModelSizes:
    """The sizes of the causal LM of the transformers ``config`` (with ``lora_config``'s adapters when its
    ``lora_rank`` > 0); ``value_head``: the critic's, whose head maps to one value instead of the vocabulary."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    adapters = lora_config or SimpleNamespace(lora_rank=0)
    with torch.device("meta"):
        if value_head:
            module = AutoModelForTokenClassification.from_config(_config_with(config, num_labels=1))
        else:
            module = lora.add_adapters(AutoModelForCausalLM.from_config(config), adapters)
    blocks = fsdp.transformer_blocks(module)
    block_params = [sum(p.numel() for p in b.parameters()) for b in blocks]
    units = fsdp.block_units(blocks, min_num_params) or [blocks]
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    params = sum(p.numel() for p in module.parameters())
    adapted = [m for m in blocks[0].modules() if hasattr(m, "lora_A")] if blocks else []
    return ModelSizes(
        params=params,
        trained=sum(p.numel() for p in module.parameters() if p.requires_grad),
        root=params - sum(block_params),
        unit=max(sum(sum(p.numel() for p in b.parameters()) for b in unit) for unit in units),
        layers=len(blocks),
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        kv_dim=(getattr(config, "num_key_value_heads", None) or heads) * head_dim,
        heads=heads,
        vocab=1 if value_head else config.vocab_size,
        adapter_width=sum(m.r[lora.ADAPTER] for m in adapted),
        merged=sum(m.get_base_layer().weight.numel() for m in lora.mergeable(module)),
        module=module,
    )


def _config_with(config: Any, **changes: Any) -> Any:
    copy = config.__class__.from_dict(config.to_dict())
    for key, value in changes.items():
        setattr(copy, key, value)
    return copy


@dataclass(frozen=True)
class Placement:
    """How a role's parameters sit on a worker: sharded over ``shards`` ranks or not, in what compute dtype."""

    shards: int  # 1: no FSDP
    compute_bytes: int
    offload_params: bool  # CUDA only: parameters leave the device between the role's phases
    offload_optimizer: bool

    def persistent(self, m: ModelSizes, trained: bool) -> int:
        """Parameter bytes held between phases (``workers.roles.role.shard_role``)."""
        if self.shards > 1:
            return FP32 * m.params // self.shards
        if self.compute_bytes == FP32:
            return FP32 * m.params
        return (FP32 + self.compute_bytes) * m.params if trained else self.compute_bytes * m.params

    def gathered(self, m: ModelSizes, whole: bool = False) -> int:
        """Unsharded compute copies during a forward (root + a unit + the prefetched next), or the whole model."""
        if self.shards == 1:
            return 0
        return self.compute_bytes * (m.params if whole else m.root + 2 * m.unit)

    def optimizer(self, m: ModelSizes) -> int:
        return 2 * FP32 * m.trained // self.shards

    def gradients(self, m: ModelSizes) -> int:
        """Sharded fp32 gradients plus one unit's unsharded ones before the reduce-scatter."""
        unsharded = self.compute_bytes * min(m.unit, m.trained) if self.shards > 1 else 0
        return FP32 * m.trained // self.shards + unsharded


def placement(device: str, n_workers: int, fsdp_config: Any, trained: bool) -> Placement:
    """The placement ``workers.roles.role.shard_role`` picks for a role's ``fsdp_config`` section."""
    param_dtype, _ = fsdp.role_precision(torch.device(device), fsdp_config.mixed_precision)
    compute = FP32 if param_dtype is None else param_dtype.itemsize
    offload = device == "cuda" and bool(fsdp_config.param_offload)
    fsdp_on_one = trained and compute != FP32 and bool(fsdp_config.param_offload)
    shards = n_workers if n_workers > 1 or fsdp_on_one else 1
    return Placement(
        shards=shards,
        compute_bytes=compute,
        offload_params=offload,
        offload_optimizer=device == "cuda" and bool(getattr(fsdp_config, "optimizer_offload", False)),
    )


@dataclass(frozen=True)
class Micro:
    """One forward's batch on a worker: rows of ``prompt`` + ``response`` tokens each (the longest they may be,
    or an observed mean), and whether they are packed (remove-padding)."""

    rows: int
    prompt: int
    response: int
    padded_length: int  # max_prompt_length + max_response_length: the rows' width before packing
    packed: bool
    group: int = 1  # rows after one another that repeat a prompt and share it (actor.use_prefix_grouper)

    def geometry(self, m: ModelSizes) -> tuple[int, int, int]:
        """(tokens through the blocks, their attention row width, positions through the LM head), as the
        actor's forward lays them out: padded rows, or ``packing.pack_batch`` rows of ``pack_width``."""
        if not self.packed:
            return self.rows * self.padded_length, self.padded_length, self.rows * (self.response + 1)
        mask = torch.zeros(self.rows, self.padded_length, dtype=torch.long)
        start = self.padded_length - self.response
        mask[:, start - self.prompt : start + self.response] = 1
        ids = (torch.arange(self.rows) // self.group)[:, None].expand_as(mask).contiguous()  # a prompt per group
        units = PromptUnits.of(ids, mask, self.response, self.group > 1 and takes_dense_mask(m.module))
        packed = pack_batch(ids, mask, self.response, pack_width(m.module, mask, units.lengths), units)
        rows, row_width = packed.input_ids.shape
        return rows * row_width, row_width, rows * len(packed.keep_columns)


def activation_bytes(
    m: ModelSizes, tokens: int, width: int, compute_bytes: int, math_attention: bool, checkpointing: bool
) -> int:
    """What backward keeps of ``tokens`` through ``m``'s blocks (module docstring: activations)."""
    h, c = m.hidden, compute_bytes
    narrow = 6 * h + 2 * m.kv_dim + m.heads + m.adapter_width + width + (2 * h if m.norms_trained else 0)
    narrow += 2 * m.heads * width if math_attention else 0
    # the norms upcast to fp32: their inputs are kept in 4 bytes whatever the compute dtype
    per_block = tokens * (narrow + 4 * m.intermediate) * c + tokens * 2 * h * (FP32 - c)
    if checkpointing:  # each block keeps its input; one block at a time is recomputed in backward
        return tokens * h * c * m.layers + per_block
    return per_block * m.layers


def logits_bytes(
    head_tokens: int,
    response_tokens: int,
    vocab: int,
    compute_bytes: int,
    packed: bool,
    backward: bool,
    entropy_grad: bool = False,
    fused: bool = False,
) -> int:
    """The vocabulary logits' peak (module docstring: logits) in a log-prob forward, or an update's forward and
    backward (``entropy_grad``: entropy_coeff != 0 keeps the entropy's graph too). ``fused``
    (``model.use_fused_kernels``): one chunk of tokens' logits at a time, with a few fp32 temporaries of its size."""
    if fused:
        rows = min(response_tokens, chunk_rows(vocab))
        return rows * vocab * (compute_bytes + FUSED_TEMPORARIES * FP32)
    head = head_tokens * vocab * compute_bytes  # the LM head's output at the kept positions
    scaled = response_tokens * vocab * FP32  # fp32 logits / temperature, one row per response token
    copies = response_tokens * vocab * (compute_bytes * packed + FP32 * (compute_bytes < FP32))  # gather, fp32 cast
    forward = max(head + copies + scaled, 2 * scaled)  # then logsumexp's temporary beside the scaled logits
    if not backward:
        return forward
    # the entropy's softmax, product and logsumexp beside them; backward: the gradient back through the cast,
    # the gather and the head
    return max(forward, (4 + 2 * entropy_grad) * scaled, head + copies + 2 * scaled)


def forward_transient(m: ModelSizes, tokens: int, compute_bytes: int) -> int:
    """A no-grad forward's largest block temporaries: the MLP's gate, up and product, the attention's q/k/v/out."""
    return tokens * (3 * m.intermediate + 4 * m.hidden + 2 * m.kv_dim) * compute_bytes


def kv_cache_bytes(m: ModelSizes, rows: int, length: int, compute_bytes: int) -> int:
    """``StaticCache`` keys and values for ``rows`` sequences of ``length`` tokens: 2·L·rows·kv·length·c."""
    return 2 * m.layers * rows * m.kv_dim * length * compute_bytes


def uses_math_attention(m: ModelSizes, device: str, compute_bytes: int, width: int) -> bool:
    """Whether an update's SDPA runs the math kernel (``workers.compute.attention.sdpa_backend``'s own rule)."""
    dtype = torch.bfloat16 if compute_bytes == 2 else torch.float32
    return not isinstance(attention.sdpa_backend(m.module, torch.device(device), dtype, width), nullcontext)


@dataclass(frozen=True)
class PhasePeak:
    """A phase's peak on one worker, bytes by term (``TERMS``), and its inputs for the report."""

    name: str
    terms: dict[str, int]
    micro: Micro | None = None
    key: str | None = None  # the key that sizes the phase's batch
    activations_other: int | None = None  # activations with gradient checkpointing switched the other way

    @property
    def total(self) -> int:
        return sum(self.terms.values())


@dataclass(frozen=True)
class MemoryEstimate:
    device: str
    phases: tuple[PhasePeak, ...]

    @property
    def peak(self) -> PhasePeak:
        return max(self.phases, key=lambda phase: phase.total)
