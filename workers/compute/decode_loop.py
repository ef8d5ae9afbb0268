"""The pieces of a decode loop over a KV cache, shared by the rollout's loops.

``workers.compute.rollout.generate_sequences`` (the HF module's forward per token), ``workers.compute.decode``'s
compiled step and ``workers.compute.turn_sampler``'s multi-turn loop build on them:

- **Prefill**: :func:`prefill` fills a ``StaticCache`` with the prompts, each distinct prompt once (packed,
  without its left padding, where the attention takes a dense mask), and :func:`next_token_logits` feeds tokens
  on; :func:`select_cache_rows` keeps the cache rows still decoding.
- **A token**: :func:`sample_next_token` (temperature, top-k, top-p; greedy at temperature 0), its log-prob under
  the policy (:func:`token_log_probs`), and the stop tokens as a tensor (:func:`eos_tensor`).
- **The rows still decoding**, read on the host once every ``EOS_CHECK_INTERVAL`` tokens
  (:func:`count_live_rows`), with a partial rollout's stopping rule (:class:`Partial`); :func:`live_rows` and
  :func:`ended_rows` index them, and :class:`LoopRows` records each sampled token.
- **The output batch**: :func:`rollout_batch` joins the prompts and the responses (the vLLM rollout's and the agent
  loop's too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import DynamicCache, StaticCache

from algos.host_sync import host_read
from workers.compute.logprob import hidden_states_out, output_head
from workers.compute.packing import (
    best_fit_decreasing,
    block_causal_mask,
    model_attention_mask,
    pack_width,
    takes_dense_mask,
)

EOS_CHECK_INTERVAL = 8  # decode steps between the host reads of how many rows are still live


@dataclass(frozen=True)
class Partial:
    """A piece of a partial rollout (``trainer.asynchronous.partial``): each row's ``budget`` (B,) of tokens left, and
    when to stop before every row has ended: once ``quota`` groups (``group`` (B,) ints in [0, B): a prompt's rows) have
    all their rows ended and no ``required`` (B,) bool row is still decoding (checked every ``EOS_CHECK_INTERVAL``
    tokens)."""

    budget: Tensor
    group: Tensor
    quota: int
    required: Tensor


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float = 1.0) -> Tensor:
    """Set logits outside the top-k / nucleus (top-p) set to -inf. logits (B, V) -> (B, V).

    top_k <= 0 or None disables top-k; top_p >= 1 disables nucleus filtering. The most likely token always
    survives, so no row is left without a candidate.
    """
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1) smallest logit kept
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already cover top_p of the mass
        drop_sorted = (probs.cumsum(dim=-1) - probs) > top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next_token(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = -1,
    top_p: float = 1.0,
    do_sample: bool = True,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Next token ids (B,) from last-position logits (B, V); greedy when ``do_sample`` is off or temperature is 0."""
    logits = logits.float()
    if not do_sample or temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
    # inverse-CDF sampling: one uniform draw per row (multinomial draws one per vocabulary entry)
    cdf = probs.cumsum(dim=-1)  # (B, V)
    u = (1 - torch.rand(cdf.shape[0], 1, device=cdf.device, generator=generator)) * cdf[:, -1:]  # (B, 1) in (0, mass]
    # the first index with cdf >= u: it exists (u <= mass = cdf[-1]), and a token of probability 0 is never it,
    # since it repeats its left neighbour's cdf (or is 0 < u at index 0)
    return torch.searchsorted(cdf, u).squeeze(-1)


def eos_tensor(eos_token_id: int | Sequence[int] | None, device: torch.device) -> Tensor:
    """The stop token ids (K,) long on ``device``: one id, several, or none (``None``: never stops)."""
    ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return torch.tensor(ids, dtype=torch.long, device=device)


def token_log_probs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """log π(token) (B,) under softmax(logits / temperature) (B, V), fp32: the policy's, before any filtering.

    ``temperature`` <= 0 (greedy) scores under the untempered policy.
    """
    z = logits.float()
    if temperature > 0 and temperature != 1.0:
        z = z / temperature
    return z.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(z, dim=-1)


def ended_rows(finished: Tensor, rows: Tensor, batch_size: int) -> Tensor:
    """(B,) bool: the rows that ended; ``rows`` are those still in the loop (the others ended and left it)."""
    ended = torch.ones(batch_size, dtype=torch.bool, device=finished.device)
    ended[rows] = finished
    return ended


def count_live_rows(finished: Tensor, rows: Tensor, batch_size: int, partial: Partial | None) -> tuple[int, bool]:
    """(how many rows are still decoding, whether a partial rollout's piece has enough ended): one host read.
    A meta batch (no data) reads as half its rows live and never enough: it drops rows, and stops once none is."""
    live = (~finished).sum()
    if partial is None:
        return host_read("rollout.live_rows", live, meta_value=len(rows) // 2), False
    ended, group = ended_rows(finished, rows, batch_size), partial.group.to(finished.device)
    per_group = torch.zeros(batch_size, dtype=torch.long, device=ended.device)  # group ids are 0 .. B-1 at most
    members, open_rows = (per_group.index_add(0, group, x.long()) for x in (torch.ones_like(ended), ~ended))
    complete = ((members > 0) & (open_rows == 0)).sum()
    waiting = (~ended & partial.required.to(ended.device)).sum()
    live, complete, waiting = host_read(
        "rollout.live_rows", torch.stack([live, complete, waiting]), meta_value=[len(rows) // 2, 0, 1]
    )
    return live, complete >= partial.quota and waiting == 0


def live_rows(finished: Tensor, live: int) -> Tensor:
    """The indices (ascending) of the ``live`` rows not ``finished`` (B,): ``nonzero``'s, with the count read
    already (a stable sort instead of a data-dependent shape)."""
    return torch.argsort(finished.to(torch.uint8), stable=True)[:live]


@dataclass
class LoopRows:
    """What a decode loop records per response position: the outputs ``responses``, ``response_mask`` and
    ``log_probs`` (R wide), and for each row in the loop its output row (``rows``), the token it feeds in next
    (``token``), whether it ended (``finished``) and its budget of tokens (``budget``). Each loop's state extends it
    with its cache and how rows leave."""

    responses: Tensor
    response_mask: Tensor
    log_probs: Tensor
    rows: Tensor
    token: Tensor
    finished: Tensor
    budget: Tensor

    def record(
        self, t: int, token: Tensor, logits: Tensor, eos: Tensor, pad_token_id: int, temperature: float | None
    ) -> None:
        """Write the sampled ``token`` at response position t (pad where a row had ended), with its log-prob under
        ``logits`` when a ``temperature`` is given; a row ends at an EOS or at its budget."""
        rows, finished = self.rows, self.finished
        if temperature is not None:
            self.log_probs[rows, t] = token_log_probs(logits, token, temperature).masked_fill(finished, 0.0)
        self.token = torch.where(finished, pad_token_id, token)
        self.responses[rows, t] = self.token
        self.response_mask[rows, t] = (~finished).to(self.response_mask.dtype)
        self.finished |= torch.isin(self.token, eos) | (self.budget <= t + 1)

    def batch_rows(self) -> int:
        """How many of ``rows`` are batch rows (all of them, unless a loop keeps spare rows after them)."""
        return len(self.rows)

    def batch(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        return_log_probs: bool,
        partial: Partial | None,
    ) -> dict[str, Tensor]:
        """The rollout batch of the prompts (B, P) and the first B output rows, with ``rollout_log_probs`` and (a
        partial rollout's piece) ``ended`` when asked."""
        batch, real = input_ids.shape[0], self.batch_rows()
        out = rollout_batch(input_ids, attention_mask, position_ids, self.responses[:batch], self.response_mask[:batch])
        if return_log_probs:
            out["rollout_log_probs"] = self.log_probs[:batch]
        if partial is not None:
            out["ended"] = ended_rows(self.finished[:real], self.rows[:real], batch)
        return out


def select_cache_rows(cache: Any, index: Tensor) -> None:
    """Keep the cache rows ``index`` (in that order), in every layer. ``Cache.reorder_cache`` would first read the
    cache's length from the device (a host sync)."""
    for layer in cache.layers:
        if layer.is_initialized:
            layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)


def prefill(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, max_cache_len: int
) -> tuple[StaticCache, Tensor]:
    """(a ``StaticCache`` of ``max_cache_len`` positions holding the left-padded prompts (B, P) at columns 0..P-1,
    the next-token logits (B, V) after each prompt).

    Each distinct prompt (ids, mask and positions alike) runs once and its cache rows are copied to the rows that
    repeat it. With sdpa or eager attention and full-attention layers the distinct prompts run packed without
    their padding; otherwise (flash-attention, sliding-window layers) they run left-padded. The plan (distinct
    prompts, packing) is made where the prompts are, the host's in a worker; the forward runs on the model's device.
    """
    device = next(model.parameters()).device
    rows = torch.cat([input_ids, attention_mask.to(input_ids.dtype), position_ids.to(input_ids.dtype)], dim=-1)
    distinct, inverse = torch.unique(rows, dim=0, return_inverse=True)
    ids, mask, positions = distinct.split(input_ids.shape[1], dim=-1)
    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    if takes_dense_mask(model) and (width := pack_width(model, _trim_left_padding(mask))) is not None:
        logits = _packed_prefill(model, ids, mask, positions, cache, width)
    else:
        padded_mask = torch.cat([mask, mask.new_zeros(len(mask), max_cache_len - mask.shape[1])], dim=-1)
        logits = next_token_logits(model, *(x.to(device) for x in (ids, padded_mask, positions)), cache)
    inverse = inverse.to(device)
    select_cache_rows(cache, inverse)
    return cache, logits[inverse]


def next_token_logits(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, cache: StaticCache
) -> Tensor:
    """Logits (B, V) after the last of ``input_ids`` (B, T), appending their keys and values to ``cache``.

    ``attention_mask`` (B, max_cache_len) marks every cache position to attend to, these tokens' included. The LM
    head runs on the last position only, as a (B, hidden) matmul.
    """
    head = output_head(model)
    with hidden_states_out(head):
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
    return out if head is None else F.linear(out, head.weight, head.bias)


def _trim_left_padding(mask: Tensor) -> Tensor:
    """The columns of a left-padded (B, P) mask from the longest prompt's first token on."""
    return mask[:, mask.shape[1] - int(mask.sum(-1).max()) :]


def _packed_prefill(
    model: nn.Module, ids: Tensor, mask: Tensor, positions: Tensor, cache: StaticCache, width: int
) -> Tensor:
    """Prefill the left-padded prompts (U, P) packed into rows of ``width`` tokens (whole prompts, best-fit
    decreasing), attending within each prompt only; write their keys and values into ``cache`` as the padded
    layout has them (zeros at the padding). Returns the logits (U, V) after each prompt's last token. Planned on the
    prompts' device, run on the model's."""
    device = next(model.parameters()).device
    valid = mask.bool()
    lengths = valid.sum(-1).tolist()
    bins = best_fit_decreasing(lengths, max(width, *lengths))
    width = max(sum(lengths[i] for i in members) for members in bins)  # no row wider than its fullest bin
    first = torch.zeros(len(lengths), dtype=torch.long, device=ids.device)  # each prompt's first slot in (K·W)
    for row, members in enumerate(bins):
        offset = row * width
        for i in members:
            first[i], offset = offset, offset + lengths[i]
    slots = torch.where(valid, first[:, None] + valid.long().cumsum(-1) - 1, len(bins) * width)  # (U, P); pad: the end
    packed_ids = ids.new_zeros(len(bins) * width + 1)
    packed_ids[slots[valid]] = ids[valid]
    packed_positions = torch.zeros_like(packed_ids)
    packed_positions[slots[valid]] = positions[valid]
    owner = -1 - torch.arange(packed_ids.numel(), device=ids.device)  # an unused slot attends to itself only
    owner[slots[valid]] = valid.nonzero()[:, 0]
    owner = owner[:-1].view(len(bins), width)
    block_mask = block_causal_mask(owner)  # (K, 1, W, W): True = attend
    last = first + torch.tensor(lengths, device=ids.device) - 1  # (U,) the slot of each prompt's last token
    packed_ids, packed_positions, block_mask, last, slots = (
        x.to(device) for x in (packed_ids, packed_positions, block_mask, last, slots)
    )
    head, packed = output_head(model), DynamicCache()
    with hidden_states_out(head):
        out = model(
            input_ids=packed_ids[:-1].view(len(bins), width),
            attention_mask=model_attention_mask(model, block_mask),
            position_ids=packed_positions[:-1].view(len(bins), width),
            past_key_values=packed,
            use_cache=True,
        ).logits
    out = out.flatten(0, 1)[last]
    for layer, states in enumerate(packed.layers):
        cache.update(*(_padded_layout(t, slots) for t in (states.keys, states.values)), layer)
    return out if head is None else F.linear(out, head.weight, head.bias)


def _padded_layout(states: Tensor, slots: Tensor) -> Tensor:
    """Packed keys or values (K, heads, W, d) -> the prompts' left-padded layout (U, heads, P, d), zero at padding
    (``slots`` (U, P): each column's flat index into (K·W), or K·W for padding)."""
    flat = states.transpose(1, 2).flatten(0, 1)  # (K·W, heads, d)
    flat = torch.cat([flat, flat.new_zeros(1, *flat.shape[1:])])
    return flat[slots].transpose(1, 2)


def rollout_batch(
    prompts: Tensor, prompt_mask: Tensor, prompt_positions: Tensor, responses: Tensor, response_mask: Tensor
) -> dict[str, Tensor]:
    """Join prompts (B, P) and responses (B, R) into the rollout batch; response positions continue the prompt's."""
    offsets = torch.arange(1, responses.shape[1] + 1, device=responses.device, dtype=prompt_positions.dtype)
    return {
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=-1),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=-1),
        "position_ids": torch.cat([prompt_positions, prompt_positions[:, -1:] + offsets], dim=-1),
        "response_mask": response_mask,
    }
