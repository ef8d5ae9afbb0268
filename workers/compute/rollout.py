"""Rollout: sample responses from the actor's own model with a KV cache (no second copy of the weights).

A hand-written decode loop over ``past_key_values`` instead of ``model.generate``: it is short, it is faster
for small models, and it has no hidden collectives, so under FSDP (inside ``gathered_params``) ranks that
finish decoding at different steps never wait on each other. The pieces are public for other decode loops (a
multi-turn, tool-calling rollout): :func:`prefill`, :func:`next_token_logits`, :func:`sample_next_token`,
:func:`token_log_probs` and :func:`eos_token_ids`.

- **One prefill per prompt.** The n samples of a prompt arrive as n identical rows; :func:`prefill` runs each
  distinct prompt once and copies its KV cache to its rows. With sdpa or eager attention the distinct prompts run
  packed, without their left padding (whole prompts in rows of ``packing.pack_width``'s width, a block-diagonal
  causal mask), and their keys and values are laid out in the padded batch's cache.
- **A static cache.** The KV cache and the attention mask are preallocated at full length (``StaticCache``), so
  every decode step has the same shapes: a compiled model (``actor.compile_model``) runs one graph for all of
  them instead of one with a growing dynamic length.
- **Ended rows leave.** Once half of the rows being decoded have ended, the ended ones leave the batch and the
  cache (:func:`select_cache_rows`): sampled responses end at very different lengths, and decoding an ended row
  costs as much as a live one (a compiled model then adds one graph with a dynamic batch size).
- **One host read every ``EOS_CHECK_INTERVAL`` tokens.** Which rows have ended stays on the device; the loop reads
  how many are live (to stop, or to drop the ended ones) only every ``EOS_CHECK_INTERVAL`` tokens, not once per
  token (on a GPU each read waits for the queued kernels). An ended row decodes on until then, its tokens padding.
- **Planned on the host.** The prompts arrive on the host (the worker's batch): which prompts repeat and how they
  pack are computed there, and only the tensors a forward runs on go to the model's device.
- **Log-probs on the way.** With ``return_log_probs`` each sampled token's log-prob under the temperature-scaled
  policy (before top-k / top-p filtering: the policy's, not the sampler's) comes back as ``rollout_log_probs``.
- **The LM head on the last position only**, as a (rows, hidden) matmul (``workers.compute.logprob.hidden_states_out``).
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


def _eos_tensor(eos_token_id: int | Sequence[int] | None, device: torch.device) -> Tensor:
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


@torch.no_grad()
def generate_sequences(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    *,
    response_length: int,
    eos_token_id: int | Sequence[int] | None,
    pad_token_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int | None = -1,
    do_sample: bool = True,
    generator: torch.Generator | None = None,
    return_log_probs: bool = False,
    partial: Partial | None = None,
    compile_decode: bool | str = False,
) -> dict[str, Tensor]:
    """Sample up to ``response_length`` tokens per left-padded prompt (B, P); each row stops at its EOS.

    Returns, on the model's device:
      responses (B, R) right-padded with ``pad_token_id``; input_ids = [prompts, responses]
      (B, P+R); attention_mask (B, P+R) and response_mask (B, R), 1 on generated tokens up to and including
      EOS; position_ids (B, P+R) continuing from each prompt's last position; with ``return_log_probs``,
      rollout_log_probs (B, R) fp32 (:func:`token_log_probs` of each sampled token, 0 after the row ended).
      ``eos_token_id=None`` never stops. Identical prompt rows share one prefill (:func:`prefill`), planned on the
      prompts' device (the host's, as the worker's batch arrives). With ``partial`` (a partial rollout's piece)
      each row stops at its own budget too, the loop may stop early (:class:`Partial`), and ``ended`` (B,) bool
      says which rows ended (EOS or budget); the others' responses so far are to be continued.
      ``compile_decode`` (``rollout.compile_decode``: true, false or auto) decodes with
      ``workers.compute.decode``'s compiled step per batch bucket instead, where it applies (``decode.resolve``).
    """
    from workers.compute import decode  # imported here: decode builds on this module's pieces

    if decode.resolve(compile_decode, model):
        return decode.generate(
            model,
            input_ids,
            attention_mask,
            position_ids,
            response_length=response_length,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            return_log_probs=return_log_probs,
            partial=partial,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            do_sample=do_sample,
            generator=generator,
        )
    device = next(model.parameters()).device
    cache, logits = prefill(model, input_ids, attention_mask, position_ids, input_ids.shape[1] + response_length)
    input_ids, attention_mask, position_ids = (t.to(device) for t in (input_ids, attention_mask, position_ids))
    batch_size, prompt_length = input_ids.shape
    eos = _eos_tensor(eos_token_id, device)
    responses = torch.full((batch_size, response_length), pad_token_id, dtype=input_ids.dtype, device=device)
    response_mask = torch.zeros((batch_size, response_length), dtype=attention_mask.dtype, device=device)
    log_probs = torch.zeros((batch_size, response_length), dtype=torch.float32, device=device)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, do_sample=do_sample, generator=generator)
    # the mask covers the whole cache; each step switches on the position of the token it feeds in
    full_mask = torch.cat([attention_mask, attention_mask.new_zeros(batch_size, response_length)], dim=-1)
    step_pos = position_ids[:, -1:]
    rows = torch.arange(batch_size, device=device)  # the batch row of each row still being decoded
    budget = torch.full((batch_size,), response_length, device=device) if partial is None else partial.budget.to(device)
    for t in range(response_length):
        token = sample_next_token(logits, **sampling)
        if return_log_probs:
            log_probs[rows, t] = token_log_probs(logits, token, temperature).masked_fill(finished, 0.0)
        token = torch.where(finished, pad_token_id, token)
        responses[rows, t] = token
        response_mask[rows, t] = (~finished).to(response_mask.dtype)
        finished |= torch.isin(token, eos) | (budget <= t + 1)
        if t == response_length - 1:
            break
        if (t + 1) % EOS_CHECK_INTERVAL == 0:
            live, enough = _live_rows(finished, rows, batch_size, partial)
            if live == 0 or enough:
                break
            if 2 * live <= len(rows):  # a finished row costs as much to decode as a live one: drop the finished
                keep = live_rows(finished, live)
                select_cache_rows(cache, keep)
                rows, full_mask, step_pos, token, finished, budget = (
                    x[keep] for x in (rows, full_mask, step_pos, token, finished, budget)
                )
        # the finished rows left keep decoding (batched) but their tokens are overwritten with pad above
        full_mask[:, prompt_length + t] = 1
        step_pos = step_pos + 1
        logits = next_token_logits(model, token.unsqueeze(-1), full_mask, step_pos, cache)
    out = rollout_batch(input_ids, attention_mask, position_ids, responses, response_mask)
    if return_log_probs:
        out["rollout_log_probs"] = log_probs
    if partial is not None:
        out["ended"] = _ended(finished, rows, batch_size)
    return out


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


PARTIAL_KEYS = ("response_budget", "prompt_group", "required_rows")  # a piece's tensors (B,) as the worker gets them
QUOTA = "partial_quota"  # meta_info: the piece's quota of complete groups


def partial_piece(batch: Any, meta_info: dict) -> dict[str, Partial]:
    """``{"partial": Partial}`` when the worker's ``batch`` is a partial rollout's piece (it carries
    ``PARTIAL_KEYS``), else ``{}``: the keyword :func:`generate_sequences` takes."""
    if PARTIAL_KEYS[0] not in batch.keys():
        return {}
    budget, group, required = (batch[k] for k in PARTIAL_KEYS)
    group = torch.unique(group, return_inverse=True)[1]  # this rank's groups numbered 0 .. (planned on the host)
    return {"partial": Partial(budget, group, int(meta_info[QUOTA]), required.bool())}


def _ended(finished: Tensor, rows: Tensor, batch_size: int) -> Tensor:
    """(B,) bool: the rows that ended; ``rows`` are those still in the loop (the others ended and left it)."""
    ended = torch.ones(batch_size, dtype=torch.bool, device=finished.device)
    ended[rows] = finished
    return ended


def _live_rows(finished: Tensor, rows: Tensor, batch_size: int, partial: Partial | None) -> tuple[int, bool]:
    """(how many rows are still decoding, whether a partial rollout's piece has enough ended): one host read.
    A meta batch (no data) reads as half its rows live and never enough: it drops rows, and stops once none is."""
    live = (~finished).sum()
    if partial is None:
        return host_read("rollout.live_rows", live, meta_value=len(rows) // 2), False
    ended, group = _ended(finished, rows, batch_size), partial.group.to(finished.device)
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
