"""Sampling the model's turns of a multi-turn rollout: the one step of the agent loop an engine provides.

``TurnSampler`` is the interface: given left-padded prompts, sample each row's assistant turn until it samples a
stop token; hand the turns that ended (all rows whose turn ended at once, so their tools run together) to
``end_turns``, which answers per row with the ids of the tool turn to feed next (not sampled) or None (the row is
finished); feed them and sample the next turn; stop a row at ``response_length`` tokens. The sampled ids must be
returned exactly as sampled (the agent loop checks it: ``multi_turn/tokenization_mismatch_ratio``).

``HFTurnSampler`` is the Hugging Face implementation on the actor's own module: the rows decode in lockstep, each
at its own turn, over one KV cache that carries across turns. Every decoding step writes response position t of
every row: sampled, or *forced* (a token of a tool turn the row is feeding in). A tool turn is thus prefilled one
token per step alongside the other rows' decoding, into the same cache: no turn recomputes an earlier one, and
since every row advances one position per step the batch's step count is its longest row's length either way.
When every live row is feeding forced tokens, they go in one forward (a chunk). An engine that generates whole
turns per request (vLLM) implements the same interface by generating each live row's next turn from its tokens
so far, calling ``end_turns`` with the rows that stopped, and appending the answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from workers.compute.rollout import next_token_logits, prefill, sample_next_token, token_log_probs

# {row: the ids it sampled in the turn that just ended, its stop token last} -> {row: tool-turn ids, or None}
EndTurns = Callable[[dict[int, list[int]]], dict[int, list[int] | None]]
# (batch rows, position, logits, which rows sample this position) -> logits; for tests that script the model
LogitsProcessor = Callable[[Tensor, int, Tensor, Tensor], Tensor]


@dataclass
class SampledTurns:
    """responses (B, R) (pad after a row's end), model_mask (B, R) (1 on sampled tokens), valid (B, R) (1 on every
    real token, sampled or fed), finished (B,) (False: the row used the whole budget) and log_probs (B, R) fp32
    (each sampled token's log-prob under the policy when asked for, 0 on fed tokens and padding; else zeros)."""

    responses: Tensor
    model_mask: Tensor
    valid: Tensor
    finished: Tensor
    log_probs: Tensor


class TurnSampler:
    """Samples the assistant turns of a batch of conversations (see the module docstring)."""

    def __call__(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        *,
        response_length: int,
        eos_token_id: Sequence[int],
        pad_token_id: int,
        end_turns: EndTurns,
        sampling: dict[str, Any],
        return_log_probs: bool = False,
    ) -> SampledTurns:
        raise NotImplementedError


class HFTurnSampler(TurnSampler):
    """Lockstep decoding with forced tool turns on a Hugging Face causal LM (``logits_processor``: tests only)."""

    def __init__(self, model: nn.Module, logits_processor: LogitsProcessor | None = None) -> None:
        self.model, self.logits_processor = model, logits_processor

    @torch.no_grad()
    def __call__(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        *,
        response_length: int,
        eos_token_id: Sequence[int],
        pad_token_id: int,
        end_turns: EndTurns,
        sampling: dict[str, Any],
        return_log_probs: bool = False,
    ) -> SampledTurns:
        model, device = self.model, next(self.model.parameters()).device
        input_ids, attention_mask, position_ids = (x.to(device) for x in (input_ids, attention_mask, position_ids))
        (batch, prompt_length), length = input_ids.shape, response_length
        eos = torch.tensor(list(eos_token_id), dtype=torch.long, device=device)
        out = SampledTurns(
            responses=torch.full((batch, length), pad_token_id, dtype=torch.long, device=device),
            model_mask=torch.zeros((batch, length), dtype=torch.long, device=device),
            valid=torch.zeros((batch, length), dtype=torch.long, device=device),
            finished=torch.zeros(batch, dtype=torch.bool, device=device),
            log_probs=torch.zeros((batch, length), dtype=torch.float32, device=device),
        )
        forced = torch.full((batch, length), -1, dtype=torch.long, device=device)  # -1: sample this position
        turn_start = [0] * batch
        cache, logits = prefill(model, input_ids, attention_mask, position_ids, prompt_length + length)
        full_mask = torch.cat([attention_mask, attention_mask.new_zeros(batch, length)], dim=-1)
        rows, step_pos = torch.arange(batch, device=device), position_ids[:, -1:]
        t = 0
        while True:
            plan, live = forced[rows, t], ~out.finished[rows]
            sampled = live & (plan < 0)
            policy_logits = logits
            if self.logits_processor is not None:
                logits = self.logits_processor(rows, t, logits, sampled)
            token = torch.where(live, torch.where(plan < 0, sample_next_token(logits, **sampling), plan), pad_token_id)
            out.responses[rows, t], out.valid[rows, t], out.model_mask[rows, t] = token, live.long(), sampled.long()
            if return_log_probs:
                scored = token_log_probs(policy_logits, token, sampling.get("temperature", 1.0))
                out.log_probs[rows, t] = scored.masked_fill(~sampled, 0.0)
            ended = rows[sampled & torch.isin(token, eos)].tolist()
            if ended:
                _end_turns(end_turns, ended, t, out, forced, turn_start)
            live = ~out.finished[rows]
            if t == length - 1 or not live.any():
                return out
            if 2 * int(live.sum()) <= len(rows):  # a finished row costs as much to decode as a live one: drop them
                keep = live.nonzero().squeeze(-1)
                cache.reorder_cache(keep)
                rows, full_mask, step_pos, token, live = (x[keep] for x in (rows, full_mask, step_pos, token, live))
            span = 1  # the next positions every live row is forced at go into this forward too
            while t + span < length and bool(((forced[rows, t + span] >= 0) | ~live).all()):
                span += 1
            chunk = torch.where(live[:, None], forced[rows, t + 1 : t + span], pad_token_id)
            out.responses[rows, t + 1 : t + span], out.valid[rows, t + 1 : t + span] = chunk, live[:, None].long()
            full_mask[:, prompt_length + t : prompt_length + t + span] = 1
            positions = step_pos + torch.arange(1, span + 1, device=device)
            step_pos = positions[:, -1:]
            logits = next_token_logits(model, torch.cat([token[:, None], chunk], dim=-1), full_mask, positions, cache)
            t += span


def _end_turns(
    end_turns: EndTurns, ended: list[int], t: int, out: SampledTurns, forced: Tensor, turn_start: list[int]
) -> None:
    """Hand the turns that ended at position t to ``end_turns``; finish the rows it says, plan the others' tool
    turns as forced positions from t + 1."""
    turns = {row: out.responses[row, turn_start[row] : t + 1].tolist() for row in ended}
    for row, ids in end_turns(turns).items():
        if ids is None:
            out.finished[row] = True
        else:
            forced[row, t + 1 : t + 1 + len(ids)] = torch.tensor(ids, dtype=torch.long, device=forced.device)
            turn_start[row] = t + 1 + len(ids)
