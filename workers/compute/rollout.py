"""Rollout: sample responses from the actor's own model with a KV cache (no second copy of the weights).

A hand-written decode loop over ``past_key_values`` instead of ``model.generate``: it is short, it is faster
for small models, and it has no hidden collectives, so under FSDP (inside ``gathered_params``) ranks that
finish decoding at different steps never wait on each other. Its pieces, shared with the other decode loops
(``workers.compute.decode``'s compiled step, a multi-turn, tool-calling rollout), are ``workers.compute.decode_loop``'s:
``prefill``, ``next_token_logits``, ``sample_next_token``, ``token_log_probs`` and ``eos_tensor``.

- **One prefill per prompt.** The n samples of a prompt arrive as n identical rows; ``prefill`` runs each
  distinct prompt once and copies its KV cache to its rows. With sdpa or eager attention the distinct prompts run
  packed, without their left padding (whole prompts in rows of ``packing.pack_width``'s width, a block-diagonal
  causal mask), and their keys and values are laid out in the padded batch's cache.
- **A static cache.** The KV cache and the attention mask are preallocated at full length (``StaticCache``), so
  every decode step has the same shapes: a compiled model (``actor.compile_model``) runs one graph for all of
  them instead of one with a growing dynamic length.
- **Ended rows leave.** Once half of the rows being decoded have ended, the ended ones leave the batch and the
  cache (``select_cache_rows``): sampled responses end at very different lengths, and decoding an ended row
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

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from workers.compute import decode, decode_loop


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
    partial: decode_loop.Partial | None = None,
    compile_decode: bool | str = False,
) -> dict[str, Tensor]:
    """Sample up to ``response_length`` tokens per left-padded prompt (B, P); each row stops at its EOS.

    Returns, on the model's device:
      responses (B, R) right-padded with ``pad_token_id``; input_ids = [prompts, responses]
      (B, P+R); attention_mask (B, P+R) and response_mask (B, R), 1 on generated tokens up to and including
      EOS; position_ids (B, P+R) continuing from each prompt's last position; with ``return_log_probs``,
      rollout_log_probs (B, R) fp32 (``decode_loop.token_log_probs`` of each sampled token, 0 after the row
      ended). ``eos_token_id=None`` never stops. Identical prompt rows share one prefill (``decode_loop.prefill``),
      planned on the prompts' device (the host's, as the worker's batch arrives). With ``partial`` (a partial
      rollout's piece) each row stops at its own budget too, the loop may stop early (``decode_loop.Partial``), and
      ``ended`` (B,) bool says which rows ended (EOS or budget); the others' responses so far are to be continued.
      ``compile_decode`` (``rollout.compile_decode``: true, false or auto) decodes with
      ``workers.compute.decode``'s own step per batch bucket instead, compiled (true) or eager (auto on a CPU),
      where it applies (``decode.resolve``).
    """
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, do_sample=do_sample, generator=generator)
    mode = decode.resolve(compile_decode, model)
    loop = _hf_loop if mode == "hf" else functools.partial(decode.generate, compiled=mode == "compiled")
    return loop(
        model,
        input_ids,
        attention_mask,
        position_ids,
        response_length=response_length,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        return_log_probs=return_log_probs,
        partial=partial,
        **sampling,
    )


def _hf_loop(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    *,
    response_length: int,
    eos_token_id: int | Sequence[int] | None,
    pad_token_id: int,
    return_log_probs: bool = False,
    partial: decode_loop.Partial | None = None,
    **sampling: Any,
) -> dict[str, Tensor]:
    """:func:`generate_sequences` with the HF module's forward per token (``sampling``: temperature, top_p, top_k,
    do_sample, generator): prefill, then sample, record and feed in each token, every ``EOS_CHECK_INTERVAL`` tokens
    checking whether to stop or to drop the ended rows."""
    device = next(model.parameters()).device
    prompt_length = input_ids.shape[1]
    cache, logits = decode_loop.prefill(model, input_ids, attention_mask, position_ids, prompt_length + response_length)
    input_ids, attention_mask, position_ids = (t.to(device) for t in (input_ids, attention_mask, position_ids))
    eos = decode_loop.eos_tensor(eos_token_id, device)
    state = _Decoding.start(input_ids, attention_mask, position_ids, response_length, pad_token_id, partial)
    scoring = sampling.get("temperature", 1.0) if return_log_probs else None  # the temperature log-probs take
    for t in range(response_length):
        token = decode_loop.sample_next_token(logits, **sampling)
        state.record(t, token, logits, eos, pad_token_id, scoring)
        if t == response_length - 1:
            break
        if (t + 1) % decode_loop.EOS_CHECK_INTERVAL == 0 and state.stops(cache, partial):
            break
        logits = state.advance(model, cache, prompt_length + t)
    return state.batch(input_ids, attention_mask, position_ids, return_log_probs, partial)


@dataclass
class _Decoding(decode_loop.LoopRows):
    """The HF loop's state. The outputs (B, R): ``responses``, ``response_mask`` and ``log_probs``; and, for the rows
    still in the loop (the others ended and left it), each one's batch row (``rows``), its mask over the whole cache
    (``full_mask``), the position of the token it feeds in next (``step_pos``) and that token, whether it ended
    (``finished``) and its budget of tokens."""

    full_mask: Tensor
    step_pos: Tensor

    @classmethod
    def start(
        cls,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        response_length: int,
        pad_token_id: int,
        partial: decode_loop.Partial | None,
    ) -> _Decoding:
        """Nothing sampled yet, every row in the loop, the prompts (B, P) on the model's device."""
        (batch_size, _), device = input_ids.shape, input_ids.device
        budget = torch.full((batch_size,), response_length, device=device) if partial is None else partial.budget
        return cls(
            responses=torch.full((batch_size, response_length), pad_token_id, dtype=input_ids.dtype, device=device),
            response_mask=torch.zeros((batch_size, response_length), dtype=attention_mask.dtype, device=device),
            log_probs=torch.zeros((batch_size, response_length), dtype=torch.float32, device=device),
            rows=torch.arange(batch_size, device=device),
            # the mask covers the whole cache; each step switches on the position of the token it feeds in
            full_mask=torch.cat([attention_mask, attention_mask.new_zeros(batch_size, response_length)], dim=-1),
            step_pos=position_ids[:, -1:],
            token=input_ids.new_zeros(batch_size),
            finished=torch.zeros(batch_size, dtype=torch.bool, device=device),
            budget=budget.to(device),
        )

    def stops(self, cache: Any, partial: decode_loop.Partial | None) -> bool:
        """Whether the loop stops (no row live, or a partial rollout's piece has enough ended), one host read;
        else, once half of the rows have ended, they leave the loop and the cache (a finished row costs as much to
        decode as a live one)."""
        live, enough = decode_loop.count_live_rows(self.finished, self.rows, len(self.responses), partial)
        if live == 0 or enough:
            return True
        if 2 * live <= len(self.rows):
            keep = decode_loop.live_rows(self.finished, live)
            decode_loop.select_cache_rows(cache, keep)
            for name in ("rows", "full_mask", "step_pos", "token", "finished", "budget"):
                setattr(self, name, getattr(self, name)[keep])
        return False

    def advance(self, model: nn.Module, cache: Any, column: int) -> Tensor:
        """Feed each row's last token in at cache ``column``: the next-token logits (rows, V). The finished rows
        left keep decoding (batched), their tokens overwritten with pad when recorded."""
        self.full_mask[:, column] = 1
        self.step_pos = self.step_pos + 1
        return decode_loop.next_token_logits(model, self.token.unsqueeze(-1), self.full_mask, self.step_pos, cache)


PARTIAL_KEYS = ("response_budget", "prompt_group", "required_rows")  # a piece's tensors (B,) as the worker gets them
QUOTA = "partial_quota"  # meta_info: the piece's quota of complete groups


def partial_piece(batch: Any, meta_info: dict) -> dict[str, decode_loop.Partial]:
    """``{"partial": Partial}`` when the worker's ``batch`` is a partial rollout's piece (it carries
    ``PARTIAL_KEYS``), else ``{}``: the keyword :func:`generate_sequences` takes."""
    if PARTIAL_KEYS[0] not in batch.keys():
        return {}
    budget, group, required = (batch[k] for k in PARTIAL_KEYS)
    group = torch.unique(group, return_inverse=True)[1]  # this rank's groups numbered 0 .. (planned on the host)
    return {"partial": decode_loop.Partial(budget, group, int(meta_info[QUOTA]), required.bool())}
