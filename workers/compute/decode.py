"""A decode step of its own over a Llama-family model's weights, compiled once per batch bucket.

``workers.compute.rollout.generate_sequences`` runs the HF module's forward once per token: about a dozen small
eager ops per layer, each dispatched through the module tree, and a cache object's bookkeeping. Here the same
math is one pure function over the weights (:func:`decode_step`), which ``torch.compile`` turns into one graph:

- **Weights read, not copied.** Embedding, each layer's q/k/v/o, gate/up/down and RMSNorm weights, the rotary
  frequencies and the (tied) LM head are the module's own tensors (a LoRA linear's merged copy inside
  ``lora.merged_adapters``: ``lora.linear_weight``).
- **A static KV cache.** The prefill (``decode_loop.prefill``, shared prompts run once) fills a cache preallocated
  at the longest sequence (prompt + response length); each step writes its keys and values at one column (a 0-d
  tensor, so the graph does not specialise on it) and attends over the whole cache under a boolean mask.
- **Batch buckets.** The rows decoded are a bucket: 1, 2, 4, 8, … up to the batch (:func:`buckets`). Every
  ``EOS_CHECK_INTERVAL`` tokens, when the live rows fit a smaller bucket, the cache is compacted to them; a
  bucket's spare rows repeat a live row and write to a scratch row of the output. So a compiled step sees at most
  ``len(buckets(B))`` shapes: one graph each (``dynamic=False``), and nothing recompiles after they are warm,
  across steps too (the weights and the cache are arguments, guarded on shape and dtype only).
- **Tokens as the HF loop's.** The math is HF's (RMSNorm in fp32, rotary in fp32 cast to the model's dtype,
  softmax in fp32); greedy decoding gives the same tokens in fp32, and bf16 log-probs within bf16's tolerance.

On CUDA the compiled step uses ``mode="reduce-overhead"``: each bucket's graph is captured as a CUDA graph and
replayed. Where the model is not one this reads (:func:`supports`), the rollout keeps the HF loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from config import engine
from workers.compute import decode_loop
from workers.parallel import lora


@dataclass(frozen=True)
class Spec:
    """The model's shape constants the step specialises on (hashable: guarded by value)."""

    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    rope_scaling: float  # the rotary embedding's attention_scaling


def decoder(model: nn.Module) -> nn.Module:
    """The causal LM under a peft wrapper (``PeftModel.get_base_model``), or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def supports(model: nn.Module) -> bool:
    """Whether :func:`read_weights` reads this model: one of ``config.engine.own_step_reads``'s, unsharded."""
    config = getattr(decoder(model), "config", None)
    return (
        config is not None
        and engine.own_step_reads(config)
        and not any(isinstance(p, torch.distributed.tensor.DTensor) for p in model.parameters())
    )


def read_weights(model: nn.Module) -> tuple[Spec, tuple]:
    """(the :class:`Spec`, the weights as the step takes them): (embed (V, H), inv_freq (d/2,), final norm (H,),
    head (V, H), layers), each layer (ln1, q, q_bias, k, k_bias, v, v_bias, o, o_bias, ln2, gate, up, down)."""
    causal = decoder(model)
    inner, config = causal.model, causal.config
    layers = []
    for block in inner.layers:
        attn, mlp = block.self_attn, block.mlp
        qkvo = [x for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj) for x in lora.linear_weight(proj)]
        ffn = [lora.linear_weight(p)[0] for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
        layers.append((block.input_layernorm.weight, *qkvo, block.post_attention_layernorm.weight, *ffn))
    rotary = inner.rotary_emb
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    spec = Spec(
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        head_dim=head_dim,
        eps=float(config.rms_norm_eps),
        rope_scaling=float(rotary.attention_scaling),
    )
    head = lora.linear_weight(causal.lm_head)[0]
    return spec, (inner.embed_tokens.weight, rotary.inv_freq, inner.norm.weight, head, tuple(layers))


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """weight · x / sqrt(mean(x²) + eps), computed in fp32 and cast back (HF's ``LlamaRMSNorm``). x (..., H)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding x·cos + rotate_half(x)·sin; x (B, heads, d), cos/sin (B, 1, d)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def decode_step(
    token: Tensor,
    position: Tensor,
    column: Tensor,
    mask: Tensor,
    weights: tuple,
    keys: Sequence[Tensor],
    values: Sequence[Tensor],
    spec: Spec,
) -> Tensor:
    """One token per row through the decoder: logits (B, V) after ``token`` (B,) at ``position`` (B,).

    Writes each layer's key and value at cache ``column`` (0-d long) of ``keys``/``values`` (B, kv_heads, L, d),
    then attends over the cache positions ``mask`` (B, L) bool marks (this token's column included).
    attention: softmax(q·Kᵀ/√d + mask) · V, the q heads grouped over their kv head (no repeated K, V).
    """
    embed, inv_freq, norm, head, layers = weights
    b, group = token.shape[0], spec.heads // spec.kv_heads
    x = embed[token]  # (B, H)
    freqs = position[:, None].float() * inv_freq.float()  # (B, d/2)
    angles = torch.cat([freqs, freqs], dim=-1)[:, None]  # (B, 1, d)
    cos, sin = ((f(angles) * spec.rope_scaling).to(x.dtype) for f in (torch.cos, torch.sin))
    bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(~mask, float("-inf"))
    bias = bias[:, None, None, :]  # (B, 1, 1, L)
    index = column.view(1)
    for (ln1, wq, bq, wk, bk, wv, bv, wo, bo, ln2, gate, up, down), k_cache, v_cache in zip(layers, keys, values):
        h = rms_norm(x, ln1, spec.eps)
        q = rotate(F.linear(h, wq, bq).view(b, spec.heads, spec.head_dim), cos, sin)
        k = rotate(F.linear(h, wk, bk).view(b, spec.kv_heads, spec.head_dim), cos, sin)
        v = F.linear(h, wv, bv).view(b, spec.kv_heads, spec.head_dim)
        k_cache.index_copy_(2, index, k[:, :, None])
        v_cache.index_copy_(2, index, v[:, :, None])
        q = q.view(b, spec.kv_heads, group, spec.head_dim)
        scores = torch.matmul(q, k_cache.transpose(-1, -2)).float() * spec.head_dim**-0.5  # (B, kvh, g, L)
        probs = torch.softmax(scores + bias, dim=-1).to(x.dtype)
        attn = torch.matmul(probs, v_cache).reshape(b, spec.heads * spec.head_dim)
        x = x + F.linear(attn, wo, bo)
        h = rms_norm(x, ln2, spec.eps)
        x = x + F.linear(F.silu(F.linear(h, gate)) * F.linear(h, up), down)
    return F.linear(rms_norm(x, norm, spec.eps), head)


def buckets(batch: int) -> list[int]:
    """The batch sizes a step runs at: the powers of two below ``batch``, then ``batch`` itself."""
    sizes = [1 << i for i in range(batch.bit_length()) if 1 << i < batch]
    return [*sizes, batch]


def bucket(live: int, batch: int) -> int:
    """The smallest bucket of ``batch`` that holds ``live`` rows."""
    return next(size for size in buckets(batch) if size >= live)


_COMPILED: dict[str, Callable] = {}
RECOMPILE_LIMIT = 64  # graphs per code object: one per bucket and model shape (torch's default, 8, is too few)


def compile_mode(device: torch.device) -> str:
    """``torch.compile``'s mode on ``device``: on CUDA ``reduce-overhead`` captures each bucket's graph as a CUDA
    graph and replays it (a step's launches cost more there than its math at a rollout's rows); elsewhere the
    default (a CPU has no graphs to capture)."""
    return "reduce-overhead" if device.type == "cuda" else "default"


def compiled_step(device: torch.device) -> Callable:
    """:func:`decode_step` under ``torch.compile(dynamic=False)`` in :func:`compile_mode`, one per process and
    mode: each bucket's shapes compile once (torch's inductor cache on disk keeps the kernels across runs and
    resumes)."""
    mode = compile_mode(device)
    if mode not in _COMPILED:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        step = torch.compile(decode_step, dynamic=False, mode=mode)
        _COMPILED[mode] = _replayed(step) if mode == "reduce-overhead" else step
    return _COMPILED[mode]


def _replayed(step: Callable) -> Callable:
    """``step`` as a CUDA graph's replay: each call begins a new graph step, since the previous call's logits
    (the graph's own output buffer, which this replay overwrites) were read before it."""

    def run(*args: Any) -> Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return step(*args)

    return run


def resolve(setting: Any, model: nn.Module) -> str:
    """``config.engine.mode_for`` ``model``'s device; ``"hf"`` for a model :func:`supports` refuses."""
    return engine.mode_for(setting, next(model.parameters()).device.type) if supports(model) else "hf"


def step_for(compiled: bool, device: torch.device) -> Callable:
    """The own step a rollout runs: :func:`compiled_step` when ``compiled``, else :func:`decode_step`."""
    return compiled_step(device) if compiled else decode_step


def mark_static(tensors: Sequence[Tensor]) -> None:
    """On CUDA, tell the graph capture these inputs (the cache) keep their address across replays."""
    for t in tensors:
        if t.device.type == "cuda":
            torch._dynamo.mark_static_address(t)


@torch.no_grad()
def generate(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    *,
    response_length: int,
    eos_token_id: int | Sequence[int] | None,
    pad_token_id: int,
    compiled: bool = True,
    return_log_probs: bool = False,
    partial: decode_loop.Partial | None = None,
    **sampling: Any,
) -> dict[str, Tensor]:
    """``rollout.generate_sequences``'s contract (same arguments, same outputs) with :func:`decode_step` per token,
    compiled per bucket when ``compiled``; ``sampling``: temperature, top_p, top_k, do_sample, generator."""
    device = next(model.parameters()).device
    prompt_length = input_ids.shape[1]
    cache, logits = decode_loop.prefill(model, input_ids, attention_mask, position_ids, prompt_length + response_length)
    input_ids, attention_mask, position_ids = (t.to(device) for t in (input_ids, attention_mask, position_ids))
    prompts = (input_ids, attention_mask, position_ids)
    state = _Buckets.start(model, cache, compiled, prompts, response_length, pad_token_id, partial)
    eos = decode_loop.eos_tensor(eos_token_id, device)
    scoring = sampling.get("temperature", 1.0) if return_log_probs else None  # the temperature log-probs take
    for t in range(response_length):
        token = decode_loop.sample_next_token(logits, **sampling)
        state.record(t, token, logits, eos, pad_token_id, scoring)
        if t == response_length - 1:
            break
        if (t + 1) % decode_loop.EOS_CHECK_INTERVAL == 0 and state.stops(partial):
            break
        logits = state.advance(t)
    return state.batch(input_ids, attention_mask, position_ids, return_log_probs, partial)


@dataclass
class _Buckets(decode_loop.LoopRows):
    """:func:`generate`'s state. The outputs (B + 1, R), row B scratch (a bucket's spare rows write there):
    ``responses``, ``response_mask`` and ``log_probs``. The bucket's rows: each one's batch row (``rows``;
    ``rows[:real]`` are batch rows, the rest spare), its cache (``keys``/``values`` per layer) and mask over it
    (``mask``), the position of the token it feeds in next and that token, whether it ended (``finished``; a spare
    row has) and its budget of tokens. And the step: the function, the weights it reads, the model's :class:`Spec`,
    and the cache column of each response position (``columns``, from ``prompt_length``)."""

    real: int
    keys: list[Tensor]
    values: list[Tensor]
    mask: Tensor
    position: Tensor
    step: Callable
    weights: tuple
    spec: Spec
    prompt_length: int
    columns: Tensor

    @classmethod
    def start(
        cls,
        model: nn.Module,
        cache: Any,
        compiled: bool,
        prompts: tuple[Tensor, Tensor, Tensor],
        response_length: int,
        pad_token_id: int,
        partial: decode_loop.Partial | None,
    ) -> _Buckets:
        """Nothing sampled yet, every row in the bucket of the whole batch: the ``prompts`` (input_ids,
        attention_mask, position_ids (B, P), on the model's device) prefilled into ``cache``."""
        input_ids, attention_mask, position_ids = prompts
        (batch, prompt_length), device = input_ids.shape, input_ids.device
        budget = torch.full((batch,), response_length, device=device) if partial is None else partial.budget
        spec, weights = read_weights(model)
        keys, values = [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]
        outputs = (batch + 1, response_length)
        return cls(
            responses=torch.full(outputs, pad_token_id, dtype=input_ids.dtype, device=device),
            response_mask=torch.zeros(outputs, dtype=attention_mask.dtype, device=device),
            log_probs=torch.zeros(outputs, dtype=torch.float32, device=device),
            rows=torch.arange(batch, device=device),
            real=batch,
            keys=keys,
            values=values,
            mask=torch.cat(
                [attention_mask.bool(), attention_mask.new_zeros(batch, response_length, dtype=torch.bool)], -1
            ),
            position=position_ids[:, -1],
            token=input_ids.new_zeros(batch),
            finished=torch.zeros(batch, dtype=torch.bool, device=device),
            budget=budget.to(device),
            step=step_for(compiled, device),
            weights=weights,
            spec=spec,
            prompt_length=prompt_length,
            columns=torch.arange(prompt_length, prompt_length + response_length, device=device),
        )

    def batch_rows(self) -> int:
        """``rows[:real]`` are batch rows; the rest are the bucket's spare rows."""
        return self.real

    def stops(self, partial: decode_loop.Partial | None) -> bool:
        """Whether the loop stops (no row live, or a partial rollout's piece has enough ended), one host read;
        else, when the live rows fit a smaller bucket, the cache is compacted to them."""
        batch = len(self.responses) - 1
        live, enough = decode_loop.count_live_rows(self.finished[: self.real], self.rows[: self.real], batch, partial)
        if live == 0 or enough:
            return True
        if (size := bucket(live, batch)) < len(self.rows):
            self._compact(live, size)
        return False

    def _compact(self, live: int, size: int) -> None:
        """Keep the ``live`` rows in a bucket of ``size``: its spare rows repeat a live row and write to scratch."""
        keep = decode_loop.live_rows(self.finished[: self.real], live)
        index = torch.cat([keep, keep[:1].expand(size - live)])
        self.keys, self.values = ([c.index_select(0, index) for c in cache] for cache in (self.keys, self.values))
        self.mask, self.position, self.token, self.budget = (
            x[index] for x in (self.mask, self.position, self.token, self.budget)
        )
        self.rows = torch.cat([self.rows[keep], self.rows.new_full((size - live,), len(self.responses) - 1)])
        self.finished = torch.cat([self.finished[keep], self.finished.new_ones(size - live)])
        self.real = live

    def advance(self, t: int) -> Tensor:
        """Feed each row's token of response position t in through the step: the next-token logits (rows, V)."""
        self.mask[:, self.prompt_length + t] = True
        self.position = self.position + 1
        mark_static([*self.keys, *self.values])
        return self.step(
            self.token, self.position, self.columns[t], self.mask, self.weights, self.keys, self.values, self.spec
        )
