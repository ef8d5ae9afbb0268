"""A device-strict stand-in causal LM for the ``fake_cuda`` tests: HF Llama cannot run on ``meta`` (its mask helper
reads a value with ``.item()``), this one runs on any device with nothing but tensor ops.

It takes the call ColoRL makes of a Hugging Face model: ``input_ids``, ``attention_mask`` (None, 2-D (B, kv) or a
4-D boolean (K, 1, W, W)), ``position_ids`` (restarts at 0 mark packed sequences when there is no mask),
``past_key_values`` (a ``transformers`` cache: StaticCache or DynamicCache), ``use_cache`` and ``logits_to_keep``;
its ``.logits`` are the LM head's output (or, for ``head="score"``, one value per position as a token-classification
value model and a sequence-classification reward model give). Learned positions instead of rotary ones.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor, nn
from transformers import LlamaConfig

VOCAB, HIDDEN, LAYERS, HEADS, MAX_POSITIONS = 48, 16, 2, 2, 64  # tests.workers.helpers.VOCAB


def standin_config() -> LlamaConfig:
    """The tiny config the caches read (layer count, heads, sdpa: packed prefill and dense masks)."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
    )
    config._attn_implementation = "sdpa"
    return config


class StandinBlock(nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(HIDDEN, HIDDEN) for _ in range(4))
        self.up_proj, self.down_proj = nn.Linear(HIDDEN, 2 * HIDDEN), nn.Linear(2 * HIDDEN, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)

    def forward(self, x: Tensor, allowed: Tensor | None, cache) -> Tensor:
        """x (B, T, H); ``allowed`` (B, 1, T, S) True = attend, S the keys' length (the cache's, or T)."""
        batch, length, _ = x.shape
        h = self.norm(x)
        q, k, v = (p(h).view(batch, length, HEADS, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        if cache is not None:
            k, v = cache.update(k, v, self.index)
        scores = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, HIDDEN)
        x = x + self.o_proj(attended)
        return x + self.down_proj(torch.relu(self.up_proj(x)))


class StandinLM(nn.Module):
    """The stand-in; ``head="lm"``: (B, T, V) logits, ``"score"``: (B, T, 1) values (a ``score`` Linear)."""

    _no_split_modules = ["StandinBlock"]

    def __init__(self, head: str = "lm") -> None:
        super().__init__()
        self.config = standin_config()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.embed_positions = nn.Embedding(MAX_POSITIONS, HIDDEN)
        self.layers = nn.ModuleList(StandinBlock(i) for i in range(LAYERS))
        if head == "lm":
            self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
        else:
            self.score = nn.Linear(HIDDEN, 1)

    def prepare_inputs_for_generation(self, *args, **kwargs):  # read (never called) by peft's causal-LM wrapper
        raise NotImplementedError

    def get_output_embeddings(self) -> nn.Module | None:
        return getattr(self, "lm_head", None)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        past_key_values=None,
        use_cache: bool = False,
        logits_to_keep: int | Tensor = 0,
        **unused,  # what peft's wrapper passes along (inputs_embeds, labels, ...: None)
    ) -> SimpleNamespace:
        batch, length = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(length, device=input_ids.device).expand(batch, length)
        x = self.embed_tokens(input_ids) + self.embed_positions(position_ids)
        cache = past_key_values if use_cache else None
        allowed = _allowed(attention_mask, position_ids, cache)
        for layer in self.layers:
            x = layer(x, allowed, cache)
        if isinstance(logits_to_keep, Tensor):
            x = x[:, logits_to_keep]
        elif logits_to_keep:
            x = x[:, -logits_to_keep:]
        head = getattr(self, "lm_head", None) or self.score
        return SimpleNamespace(logits=head(x))


def _allowed(mask: Tensor | None, positions: Tensor, cache) -> Tensor:
    """(B, 1, T, S) True = attend, as transformers builds it from the arguments ColoRL passes."""
    if mask is not None and mask.dim() == 4:
        return mask.bool()
    batch, length = positions.shape
    if mask is None:  # packed rows: a position restart opens a new sequence
        sequence = (positions == 0).long().cumsum(-1)
        same = sequence[:, :, None] == sequence[:, None, :]
        causal = torch.ones(length, length, dtype=torch.bool, device=positions.device).tril()
        return (same & causal)[:, None]
    if cache is None:  # padded rows, no cache: causal among the attended columns
        causal = torch.ones(length, length, dtype=torch.bool, device=mask.device).tril()
        return (causal & mask.bool()[:, None, :])[:, None]
    # a cache of mask.shape[1] slots; these T tokens are its last written ones: query i sees slots up to its own
    written = mask.bool()
    slot = torch.arange(mask.shape[1], device=mask.device)
    last = (written * slot).argmax(-1)  # (B,) the slot of the last of these tokens
    query_slot = last[:, None] - (length - 1 - torch.arange(length, device=mask.device))  # (B, T)
    return (written[:, None, :] & (slot[None, None, :] <= query_slot[:, :, None]))[:, None]
