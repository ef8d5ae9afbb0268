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

from algos.host_sync import host_read
from workers.compute import decode
from workers.compute.decode_loop import (
    next_token_logits,
    prefill,
    sample_next_token,
    select_cache_rows,
    token_log_probs,
)

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

    @classmethod
    def empty(cls, batch: int, length: int, pad_token_id: int, device: torch.device) -> SampledTurns:
        """Nothing sampled yet: responses all padding, no row finished."""
        zeros = lambda dtype: torch.zeros((batch, length), dtype=dtype, device=device)  # noqa: E731
        return cls(
            responses=torch.full((batch, length), pad_token_id, dtype=torch.long, device=device),
            model_mask=zeros(torch.long),
            valid=zeros(torch.long),
            finished=torch.zeros(batch, dtype=torch.bool, device=device),
            log_probs=zeros(torch.float32),
        )


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
    """Lockstep decoding with forced tool turns on a Hugging Face causal LM (``logits_processor``: tests only).

    ``compile_decode`` (``rollout.compile_decode``; ``workers.compute.decode.resolve``) decodes each sampled
    position with ``decode``'s own step over the same static cache, compiled (true) or eager (auto on a CPU), the
    rows compacted to batch buckets (finished rows fill a bucket's spare places), so nothing recompiles; a chunk of
    forced tokens still goes through the HF forward, which is told the columns the step wrote."""

    def __init__(
        self, model: nn.Module, logits_processor: LogitsProcessor | None = None, compile_decode: bool | str = False
    ) -> None:
        self.model, self.logits_processor = model, logits_processor
        mode = decode.resolve(compile_decode, model)
        self.step = None if mode == "hf" else decode.step_for(mode == "compiled", _device(model))

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
        (batch, prompt_length), length = input_ids.shape, response_length
        eos = torch.tensor(list(eos_token_id), dtype=torch.long, device=device)
        out = SampledTurns.empty(batch, length, pad_token_id, device)
        forced = torch.full((batch, length), -1, dtype=torch.long, device=device)  # -1: sample this position
        plan = _HostPlan(batch)  # what the host decides (finished rows, forced spans, the rows decoding), mirrored
        cache, logits = prefill(model, input_ids, attention_mask, position_ids, prompt_length + length)
        input_ids, attention_mask, position_ids = (x.to(device) for x in (input_ids, attention_mask, position_ids))
        full_mask = torch.cat([attention_mask, attention_mask.new_zeros(batch, length)], dim=-1)
        rows, step_pos = torch.arange(batch, device=device), position_ids[:, -1:]
        columns = torch.arange(prompt_length, prompt_length + length, device=device)  # position t's cache column
        self.weights = decode.read_weights(model) if self.step is not None else None
        t = 0
        while True:
            token, sampled = self._position(t, rows, logits, forced, out, pad_token_id, sampling, return_log_probs)
            # the one read per position: a meta batch (no data) reads as every row ending its turn
            stops = host_read("turn_sampler.ended_turns", sampled & torch.isin(token, eos), [True] * len(plan.rows))
            ended = [row for row, stop in zip(plan.rows, stops) if stop and plan.samples(row, t)]
            if ended:
                _end_turns(end_turns, ended, t, out, forced, plan)
            live_rows = [i for i, row in enumerate(plan.rows) if not plan.finished[row]]
            if t == length - 1 or not live_rows:
                return out
            if (kept := self._kept(live_rows, len(plan.rows), batch)) is not None:  # finished rows cost as live ones
                keep = torch.tensor(kept, dtype=torch.long, device=device)
                select_cache_rows(cache, keep)
                rows, full_mask, step_pos, token = (x[keep] for x in (rows, full_mask, step_pos, token))
                plan.rows = [plan.rows[i] for i in kept]
            chunk = _forced_chunk(t, rows, forced, out, plan, pad_token_id)
            span = 1 + chunk.shape[1]
            full_mask[:, prompt_length + t : prompt_length + t + span] = 1
            positions = step_pos + torch.arange(1, span + 1, device=device)
            step_pos = positions[:, -1:]
            logits = self._advance(cache, token, chunk, full_mask, positions, columns[t])
            t += span

    def _position(
        self,
        t: int,
        rows: Tensor,
        logits: Tensor,
        forced: Tensor,
        out: SampledTurns,
        pad_token_id: int,
        sampling: dict[str, Any],
        return_log_probs: bool,
    ) -> tuple[Tensor, Tensor]:
        """Position t of the ``rows`` decoding, written to ``out``: a live row's sampled token from ``logits``, or
        the token of the tool turn it is fed (``forced``), a finished row's pad. Returns (the tokens (rows,), which
        rows sampled theirs)."""
        live = ~out.finished[rows]
        sampled = live & (forced[rows, t] < 0)
        policy_logits = logits
        if self.logits_processor is not None:
            logits = self.logits_processor(rows, t, logits, sampled)
        sample = sample_next_token(logits, **sampling)
        token = torch.where(live, torch.where(forced[rows, t] < 0, sample, forced[rows, t]), pad_token_id)
        out.responses[rows, t], out.valid[rows, t], out.model_mask[rows, t] = token, live.long(), sampled.long()
        if return_log_probs:
            scored = token_log_probs(policy_logits, token, sampling.get("temperature", 1.0))
            out.log_probs[rows, t] = scored.masked_fill(~sampled, 0.0)
        return token, sampled

    def _kept(self, live: list[int], decoding: int, batch: int) -> list[int] | None:
        """The places (of the ``decoding`` rows, in the cache's order) to keep when the ``live`` ones fit a smaller
        batch, else None: at most half as many; with the compiled step a smaller bucket, its spare places the
        first finished rows (they decode padding, as before they left)."""
        if self.step is None:
            return live if 2 * len(live) <= decoding else None
        size = decode.bucket(len(live), batch)
        if size >= decoding:
            return None
        spare = [i for i in range(decoding) if i not in set(live)][: size - len(live)]
        return sorted(live + spare)

    def _advance(
        self, cache: Any, token: Tensor, chunk: Tensor, mask: Tensor, positions: Tensor, column: Tensor
    ) -> Tensor:
        """The logits after ``token`` (B,) and the forced ``chunk`` (B, span - 1) at ``positions`` (B, span), the
        first written at cache ``column`` (0-d): one token through the compiled step when there is one, else (a
        chunk too) the HF forward, whose cache first counts the columns the step wrote."""
        if self.step is not None and chunk.shape[1] == 0:
            keys, values = [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]
            decode.mark_static([*keys, *values])
            spec, weights = self.weights
            return self.step(token, positions[:, 0], column, mask.bool(), weights, keys, values, spec)
        if self.step is not None:
            for layer in cache.layers:
                layer.cumulative_length.fill_(column)
        return next_token_logits(self.model, torch.cat([token[:, None], chunk], dim=-1), mask, positions, cache)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


class _HostPlan:
    """The host's copy of what it decided: the rows still decoding (batch indices, in the cache's order), which
    rows finished, each row's turn start and the span of positions its latest tool turn is fed at. The loop
    reads these instead of the device's tensors."""

    def __init__(self, batch: int) -> None:
        self.rows = list(range(batch))
        self.finished = [False] * batch
        self.turn_start = [0] * batch
        self.fed = [(0, 0)] * batch  # [start, end) of the positions the row's latest tool turn is fed at

    def forced(self, row: int, t: int) -> bool:
        start, end = self.fed[row]
        return start <= t < end

    def samples(self, row: int, t: int) -> bool:
        return not self.finished[row] and not self.forced(row, t)


def _forced_chunk(
    t: int, rows: Tensor, forced: Tensor, out: SampledTurns, plan: _HostPlan, pad_token_id: int
) -> Tensor:
    """The tokens (rows, span - 1) after position t that go into the next forward with its token: the next positions
    every live row is forced at (a finished row's pad), written to ``out``."""
    live = ~out.finished[rows]
    length, span = forced.shape[1], 1
    while t + span < length and all(plan.finished[r] or plan.forced(r, t + span) for r in plan.rows):
        span += 1
    chunk = torch.where(live[:, None], forced[rows, t + 1 : t + span], pad_token_id)
    out.responses[rows, t + 1 : t + span], out.valid[rows, t + 1 : t + span] = chunk, live[:, None].long()
    return chunk


def _end_turns(
    end_turns: EndTurns, ended: list[int], t: int, out: SampledTurns, forced: Tensor, plan: _HostPlan
) -> None:
    """Hand the turns that ended at position t to ``end_turns``; finish the rows it says, plan the others' tool
    turns as forced positions from t + 1."""
    turns = {}
    for row in ended:  # a meta batch (no data) reads as a turn of pad ids
        ids = out.responses[row, plan.turn_start[row] : t + 1]
        turns[row] = host_read("turn_sampler.turn_ids", ids, [0] * (t + 1 - plan.turn_start[row]))
    for row, ids in end_turns(turns).items():
        if ids is None:
            out.finished[row] = True
            plan.finished[row] = True
        else:
            forced[row, t + 1 : t + 1 + len(ids)] = torch.tensor(ids, dtype=torch.long, device=forced.device)
            plan.turn_start[row] = t + 1 + len(ids)
            plan.fed[row] = (t + 1, t + 1 + len(ids))
