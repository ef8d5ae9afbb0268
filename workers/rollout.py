"""Rollout: sample responses from the actor's own model with a KV cache (no second copy of the weights).

A hand-written decode loop over ``past_key_values`` instead of ``model.generate``: it is short, it is faster
for small models, and it has no hidden collectives, so under FSDP (inside ``gathered_params``) ranks that
finish decoding at different steps never wait on each other. The KV cache and the attention mask are
preallocated at full length (``StaticCache``), so every decode step has the same shapes: a compiled model
(``actor.use_torch_compile``) runs one graph for all of them instead of one with a growing dynamic length.
Once half of the rows being decoded have ended, the ended ones leave the batch and the cache
(``Cache.reorder_cache``): sampled responses end at very different lengths, and decoding an ended row costs
as much as a live one (a compiled model then adds one graph with a dynamic batch size).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from transformers import StaticCache


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


def eos_token_ids(generation_config: Any, tokenizer: Any) -> list[int]:
    """EOS ids from the generation config (may list several, e.g. Llama-3 chat) and the tokenizer."""
    ids = set()
    gen_eos = getattr(generation_config, "eos_token_id", None)
    ids.update([gen_eos] if isinstance(gen_eos, int) else gen_eos or [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def _eos_tensor(eos_token_id: int | Sequence[int] | None, device: torch.device) -> Tensor:
    ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return torch.tensor(ids, dtype=torch.long, device=device)


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
) -> dict[str, Tensor]:
    """Sample up to ``response_length`` tokens per left-padded prompt (B, P); each row stops at its EOS.

    Returns, on the model's device:
      responses (B, R) right-padded with ``pad_token_id``; input_ids = [prompts, responses]
      (B, P+R); attention_mask (B, P+R) and response_mask (B, R), 1 on generated tokens up to and including
      EOS; position_ids (B, P+R) continuing from each prompt's last position. ``eos_token_id=None`` never stops.
    """
    device = next(model.parameters()).device
    input_ids, attention_mask, position_ids = (t.to(device) for t in (input_ids, attention_mask, position_ids))
    batch_size, prompt_length = input_ids.shape
    eos = _eos_tensor(eos_token_id, device)
    responses = torch.full((batch_size, response_length), pad_token_id, dtype=input_ids.dtype, device=device)
    response_mask = torch.zeros((batch_size, response_length), dtype=attention_mask.dtype, device=device)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, do_sample=do_sample, generator=generator)

    cache = StaticCache(config=model.config, max_cache_len=prompt_length + response_length)
    # the mask covers the whole cache; each step switches on the position of the token it feeds in
    full_mask = torch.cat([attention_mask, attention_mask.new_zeros(batch_size, response_length)], dim=-1)
    step_pos = position_ids[:, -1:]
    rows = torch.arange(batch_size, device=device)  # the batch row of each row still being decoded
    logits = _last_logits(model, input_ids, full_mask, position_ids, cache, torch.arange(prompt_length, device=device))
    for t in range(response_length):
        token = sample_next_token(logits, **sampling)
        token = torch.where(finished, pad_token_id, token)
        responses[rows, t] = token
        response_mask[rows, t] = (~finished).to(response_mask.dtype)
        finished |= torch.isin(token, eos)
        live = int((~finished).sum())
        if t == response_length - 1 or live == 0:
            break
        if 2 * live <= len(rows):  # a finished row costs as much to decode as a live one: drop the finished
            keep = (~finished).nonzero().squeeze(-1)
            cache.reorder_cache(keep)
            rows, full_mask, step_pos, token, finished = (x[keep] for x in (rows, full_mask, step_pos, token, finished))
        # the finished rows left keep decoding (batched) but their tokens are overwritten with pad above
        full_mask[:, prompt_length + t] = 1
        step_pos = step_pos + 1
        position = torch.tensor([prompt_length + t], device=device)
        logits = _last_logits(model, token.unsqueeze(-1), full_mask, step_pos, cache, position)
    return _rollout_batch(input_ids, attention_mask, position_ids, responses, response_mask)


def _last_logits(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    cache: StaticCache,
    cache_position: Tensor,
) -> Tensor:
    """Logits (B, V) at the last position, writing ``input_ids``' keys and values at ``cache_position``.

    The LM head runs on that position only.
    """
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=cache,
        cache_position=cache_position,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1]


def _rollout_batch(
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
