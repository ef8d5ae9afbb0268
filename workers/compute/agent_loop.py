"""Multi-turn rollout with tools (verl's ``tool_agent``) on the actor's own model: the rows of a batch decode in
lockstep, each at its own turn, over one KV cache that carries across turns.

Every decoding step writes response position t of every row. A row's position t is either sampled (a model
token, ``response_mask`` 1) or *forced*: a token of a tool turn it is feeding in (``response_mask`` 0,
``attention_mask`` 1). When a row samples an EOS, its assistant turn ends: the turn's text is parsed for hermes
tool calls (``workers.tools.parser``), the calls of all rows that ended a turn at this step run at once
(``workers.tools.ToolBox``), and the tool messages are appended through the tokenizer's chat template; their
tokens become the row's forced tokens for the next positions. So a tool turn is prefilled one token per step
alongside the other rows' decoding, into the same cache: no turn recomputes an earlier one, and since every
row advances one position per step the batch's step count is its longest row's length either way. When every
live row is feeding forced tokens, they go in one forward (a chunk). A row stops when its turn has no call
(``answer``), at ``max_assistant_turns`` / ``max_user_turns`` (``turn_limit``), or when the response budget
cannot hold the next tool turn or is used up (``length_limit``).

The tool-turn tokens are the chat template's delta: the conversation rendered with the tool messages and the
generation prompt, minus the conversation up to the end of the model's own tokens. At the end of a rollout the
turn-by-turn ids are compared with a tokenization of the whole conversation (verl's
``tokenization_sanity_check_mode``); a difference is counted (``multi_turn/tokenization_mismatch_ratio``) and
the first one is printed.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from config.phases import PROMPT
from workers.compute.rollout import _rollout_batch, next_token_logits, prefill, sample_next_token, token_log_probs
from workers.tools import ToolBox, ToolConfigError, ToolSession, load_tools
from workers.tools.parser import parse_tool_calls

TOOL_AGENT = "tool_agent"
# end_turns(rows, t, responses) -> {row: forced token ids for a tool turn, or None: the row is finished}
EndTurns = Callable[[list[int], int, Tensor], dict[int, list[int] | None]]
# (batch rows, position, logits, which rows sample this position) -> logits; for tests that script the model
LogitsProcessor = Callable[[Tensor, int, Tensor, Tensor], Tensor]


@torch.no_grad()
def decode_with_turns(
    model: nn.Module,
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
    logits_processor: LogitsProcessor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Decode left-padded prompts (B, P) for ``response_length`` positions, with forced tool turns.

    Returns responses (B, R) (pad after a row's end), model_mask (B, R) (1 on sampled tokens), valid (B, R) (1 on
    every real token, sampled or forced), finished (B,) (False: the row used the whole budget) and log_probs
    (B, R) fp32: with ``return_log_probs`` each sampled token's ``token_log_probs`` under the policy (before
    ``logits_processor``), 0 on forced tokens and padding; zeros without.
    """
    device = next(model.parameters()).device
    input_ids, attention_mask, position_ids = (x.to(device) for x in (input_ids, attention_mask, position_ids))
    (batch, prompt_length), length = input_ids.shape, response_length
    eos = torch.tensor(list(eos_token_id), dtype=torch.long, device=device)
    responses = torch.full((batch, length), pad_token_id, dtype=torch.long, device=device)
    model_mask = torch.zeros((batch, length), dtype=torch.long, device=device)
    valid = torch.zeros_like(model_mask)
    log_probs = torch.zeros((batch, length), dtype=torch.float32, device=device)
    forced = torch.full((batch, length), -1, dtype=torch.long, device=device)  # -1: sample this position
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    cache, logits = prefill(model, input_ids, attention_mask, position_ids, prompt_length + length)
    full_mask = torch.cat([attention_mask, attention_mask.new_zeros(batch, length)], dim=-1)
    rows, step_pos = torch.arange(batch, device=device), position_ids[:, -1:]
    t = 0
    while True:
        plan, live = forced[rows, t], ~finished[rows]
        sampled = live & (plan < 0)
        policy_logits = logits
        if logits_processor is not None:
            logits = logits_processor(rows, t, logits, sampled)
        token = torch.where(live, torch.where(plan < 0, sample_next_token(logits, **sampling), plan), pad_token_id)
        responses[rows, t], valid[rows, t], model_mask[rows, t] = token, live.long(), sampled.long()
        if return_log_probs:
            scored = token_log_probs(policy_logits, token, sampling.get("temperature", 1.0))
            log_probs[rows, t] = scored.masked_fill(~sampled, 0.0)
        ended = sampled & torch.isin(token, eos)
        if ended.any():
            _plan_turns(end_turns(rows[ended].tolist(), t, responses), t, finished, forced)
        live = ~finished[rows]
        if t == length - 1 or not live.any():
            return responses, model_mask, valid, finished, log_probs
        if 2 * int(live.sum()) <= len(rows):  # a finished row costs as much to decode as a live one: drop them
            keep = live.nonzero().squeeze(-1)
            cache.reorder_cache(keep)
            rows, full_mask, step_pos, token, live = (x[keep] for x in (rows, full_mask, step_pos, token, live))
        span = 1  # the next positions every live row is forced at go into this forward too
        while t + span < length and bool(((forced[rows, t + span] >= 0) | ~live).all()):
            span += 1
        chunk = torch.where(live[:, None], forced[rows, t + 1 : t + span], pad_token_id)
        responses[rows, t + 1 : t + span], valid[rows, t + 1 : t + span] = chunk, live[:, None].long()
        full_mask[:, prompt_length + t : prompt_length + t + span] = 1
        positions = step_pos + torch.arange(1, span + 1, device=device)
        step_pos = positions[:, -1:]
        feed = torch.cat([token[:, None], chunk], dim=-1)
        logits = next_token_logits(model, feed, full_mask, positions, cache)
        t += span


def _plan_turns(plans: dict[int, list[int] | None], t: int, finished: Tensor, forced: Tensor) -> None:
    """Rows whose plan is None are finished; the others feed their tool turn's ids from position t + 1."""
    for row, ids in plans.items():
        if ids is None:
            finished[row] = True
        else:
            forced[row, t + 1 : t + 1 + len(ids)] = torch.tensor(ids, dtype=torch.long, device=forced.device)


@dataclass
class Trajectory:
    """One row's conversation and counters while it is decoded."""

    messages: list[dict[str, Any]]
    uses_tools: bool
    session: ToolSession = field(default_factory=ToolSession)
    turn_start: int = 0  # response position where the current assistant turn starts
    assistant_turns: int = 0
    user_turns: int = 0  # tool-response turns (verl counts them as user turns)
    tool_tokens: int = 0
    stop: str = "length_limit"  # answer | turn_limit | length_limit
    mismatch: bool = False


class AgentLoop:
    """The multi-turn rollout of one worker: ``tokenizer``'s chat template, the tools and ``rollout.multi_turn``."""

    def __init__(self, tokenizer: Any, toolbox: ToolBox, multi_turn: Any, default_agent: str) -> None:
        self.tokenizer, self.toolbox, self.config, self.default_agent = tokenizer, toolbox, multi_turn, default_agent
        self.trajectories: list[Trajectory] = []
        self.response_length = 0

    def generate(
        self,
        model: nn.Module,
        batch: dict[str, Tensor],
        non_tensors: dict[str, np.ndarray],
        *,
        response_length: int,
        eos_token_id: Sequence[int],
        pad_token_id: int,
        sampling: dict[str, Any],
        return_log_probs: bool = False,
        logits_processor: LogitsProcessor | None = None,
    ) -> tuple[dict[str, Tensor], dict[str, np.ndarray], dict[str, float]]:
        """Roll out every row of ``batch`` (input_ids, attention_mask, position_ids (B, P)).

        ``non_tensors`` may hold ``raw_prompt``, ``agent_name`` and ``tools_kwargs`` per row. Returns the rollout
        tensors (as ``workers.compute.rollout.generate_sequences``: with ``return_log_probs`` rollout_log_probs, 0 on tool
        tokens), per-row non-tensors (``__num_turns__``,
        ``tool_call_counts``, ``tool_error_counts``, ``tool_rewards``, ``reward_scores``,
        ``tool_response_tokens``, ``stop_reason``, ``tokenization_mismatch``, ``messages``) and worker metrics.
        """
        size = batch["input_ids"].shape[0]
        column = lambda key, default: non_tensors.get(key, [default] * size)  # noqa: E731
        self.trajectories = [
            self._trajectory(p, a, k)
            for p, a, k in zip(column("raw_prompt", None), column("agent_name", None), column("tools_kwargs", None))
        ]
        self.response_length, seconds = response_length, self.toolbox.seconds
        try:
            responses, model_mask, valid, finished, log_probs = decode_with_turns(
                model,
                batch["input_ids"],
                batch["attention_mask"],
                batch["position_ids"],
                response_length=response_length,
                eos_token_id=eos_token_id,
                pad_token_id=pad_token_id,
                end_turns=self._end_turns,
                sampling=sampling,
                return_log_probs=return_log_probs,
                logits_processor=logits_processor,
            )
        finally:  # the tools' instances are released even when decoding failed
            self.toolbox.finish([trajectory.session for trajectory in self.trajectories])
        responses, model_mask, valid = (x.cpu() for x in (responses, model_mask, valid))
        self._close_cut_turns(responses, valid, finished.cpu())
        self._check_tokenization(batch["input_ids"], batch["attention_mask"], responses, valid)
        # the attention mask covers every real token (tool tokens too), the response mask the model's only
        tensors = _rollout_batch(*(batch[k].cpu() for k in PROMPT), responses, valid)
        tensors["response_mask"] = model_mask * valid
        if return_log_probs:  # the old log-probs of an on-policy step; tool tokens are masked out of every loss
            tensors["rollout_log_probs"] = log_probs.cpu()
        metrics = {"timing_s/agent_loop/tool_calls": self.toolbox.seconds - seconds}
        return tensors, self._row_stats(), metrics

    def _trajectory(self, raw_prompt: Any, agent_name: Any, tools_kwargs: Any) -> Trajectory:
        uses_tools = (agent_name or self.default_agent) == TOOL_AGENT and isinstance(raw_prompt, (list, np.ndarray))
        messages = [dict(m) for m in raw_prompt] if uses_tools else []  # a plain-text prompt is one turn
        return Trajectory(messages, uses_tools, ToolSession(dict(tools_kwargs or {})))

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.toolbox.schemas or None, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _end_turns(self, rows: list[int], t: int, responses: Tensor) -> dict[int, list[int] | None]:
        """Rows whose assistant turn ended at position t: finish them, or run their calls and plan tool turns."""
        plans: dict[int, list[int] | None] = {}
        calling = []
        for row in rows:
            trajectory = self.trajectories[row]
            turn = responses[row, trajectory.turn_start : t + 1].tolist()
            text = self.tokenizer.decode(turn[:-1], skip_special_tokens=False)
            trajectory.assistant_turns += 1
            calls = parse_tool_calls(text) if trajectory.uses_tools else []
            if trajectory.uses_tools:
                trajectory.messages.append({"role": "assistant", "content": text})
            limits = (
                (self.config.max_assistant_turns, trajectory.assistant_turns),
                (self.config.max_user_turns, trajectory.user_turns),
            )
            if not calls or any(limit is not None and count >= limit for limit, count in limits):
                trajectory.stop, plans[row] = "turn_limit" if calls else "answer", None
                continue
            calling.append((row, calls, text + self.tokenizer.decode(turn[-1:], skip_special_tokens=False)))
        replies = self.toolbox.run_turn([(self.trajectories[row].session, calls) for row, calls, _ in calling])
        for (row, _, generated), messages in zip(calling, replies):
            plans[row] = self._tool_turn(
                self.trajectories[row],
                [{"role": "tool", "content": m} for m in messages],
                generated,
                room=self.response_length - (t + 1),
            )
        return plans

    def _tool_turn(
        self, trajectory: Trajectory, tool_messages: list[dict], generated: str, room: int
    ) -> list[int] | None:
        """The forced ids of the tool turn (None when it does not fit with a token to spare for the model)."""
        before = self._render(trajectory.messages, False)
        after = self._render(trajectory.messages + tool_messages, True)
        common = len(before) if after.startswith(before) else _common_prefix(before, after)
        end = before.rfind(generated)  # the template's text after the model's last token (e.g. a newline)
        gap = before[end + len(generated) :] if end >= 0 else ""
        trajectory.mismatch |= end < 0 or common < len(before)
        ids = self.tokenizer.encode(gap + after[common:], add_special_tokens=False)
        if len(ids) >= room:
            trajectory.stop = "length_limit"
            return None
        trajectory.messages += tool_messages
        trajectory.user_turns += 1
        trajectory.tool_tokens += len(ids)
        trajectory.turn_start = self.response_length - room + len(ids)  # the next assistant turn's first position
        return ids

    def _close_cut_turns(self, responses: Tensor, valid: Tensor, finished: Tensor) -> None:
        """A row cut by the budget mid-turn: its partial turn counts, and joins its conversation."""
        for row, trajectory in enumerate(self.trajectories):
            if finished[row]:
                continue
            trajectory.assistant_turns += 1
            if trajectory.uses_tools:
                turn = responses[row, trajectory.turn_start :][valid[row, trajectory.turn_start :].bool()]
                trajectory.messages.append(
                    {"role": "assistant", "content": self.tokenizer.decode(turn.tolist(), skip_special_tokens=False)}
                )

    def _check_tokenization(self, input_ids: Tensor, attention_mask: Tensor, responses: Tensor, valid: Tensor) -> None:
        """verl's sanity check: the turn-by-turn ids are a prefix of the whole conversation's tokenization."""
        mode = self.config.tokenization_sanity_check_mode
        if mode == "disable":  # nothing is reported, not even a template that rewrote an earlier turn
            for trajectory in self.trajectories:
                trajectory.mismatch = False
            return
        reported = False
        for row, trajectory in enumerate(self.trajectories):
            if not trajectory.uses_tools:
                continue
            ours = input_ids[row][attention_mask[row].bool()].tolist() + responses[row][valid[row].bool()].tolist()
            full = self.tokenizer.encode(self._render(trajectory.messages, False), add_special_tokens=False)
            if mode == "strict":
                same = full[: len(ours)] == ours
            else:  # ignore_strippable: the texts agree once whitespace is removed
                strip = lambda ids: re.sub(r"\s+", "", self.tokenizer.decode(ids, skip_special_tokens=False))  # noqa
                same = strip(full).startswith(strip(ours))
            trajectory.mismatch |= not same
            if trajectory.mismatch and not reported:
                reported = True
                at = next((i for i, (a, b) in enumerate(zip(ours, full)) if a != b), min(len(ours), len(full)))
                print(
                    f"[colorl] warning: multi-turn tokenization differs from the whole conversation's at token "
                    f"{at} (turn by turn {self.tokenizer.decode(ours[at : at + 8])!r}, whole "
                    f"{self.tokenizer.decode(full[at : at + 8])!r}); see multi_turn.tokenization_sanity_check_mode",
                    file=sys.stderr,
                    flush=True,
                )

    def _row_stats(self) -> dict[str, np.ndarray]:
        def column(values: list) -> np.ndarray:
            out = np.empty(len(values), dtype=object)
            out[:] = values
            return out

        ts = self.trajectories
        return {
            "__num_turns__": column([t.assistant_turns + t.user_turns + 1 for t in ts]),
            "tool_call_counts": column([t.session.calls for t in ts]),
            "tool_error_counts": column([t.session.errors for t in ts]),
            "tool_rewards": column([t.session.step_reward for t in ts]),
            "reward_scores": column([dict(t.session.reward_scores) for t in ts]),
            "tool_response_tokens": column([t.tool_tokens for t in ts]),
            "stop_reason": column([t.stop for t in ts]),
            "tokenization_mismatch": column([t.mismatch for t in ts]),
            "messages": column([t.messages for t in ts]),  # the conversation (prompt, turns, tool answers)
        }


def _common_prefix(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_tools(tokenizer: Any, multi_turn: Any) -> list[dict]:
    """Load ``multi_turn``'s tools (running the code their config names, as each rollout worker will) and check
    that ``tokenizer``'s chat template renders a tool turn; returns the tools' schemas. ToolConfigError otherwise."""
    schemas = [
        tool.get_openai_tool_schema().to_dict()
        for tool in load_tools(multi_turn.tool_config_path, multi_turn.function_tool_path).values()
    ]
    probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "r"}]
    try:
        tokenizer.apply_chat_template(probe, tools=schemas or None, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # no template, or one that refuses a tool turn
        raise ToolConfigError(
            f"the model's tokenizer cannot render a tool turn with its chat template "
            f"({type(exc).__name__}: {str(exc).splitlines()[0]})",
            "enable",
        ) from None
    return schemas


def build_agent_loop(tokenizer: Any, rollout: Any) -> AgentLoop:
    """The agent loop of ``rollout`` (the ``actor_rollout_ref.rollout`` config): its tools loaded from
    ``multi_turn.tool_config_path`` / ``function_tool_path`` (which runs the code they name)."""
    multi_turn = rollout.multi_turn
    tools = load_tools(multi_turn.tool_config_path, multi_turn.function_tool_path)
    return AgentLoop(tokenizer, ToolBox(tools, multi_turn), multi_turn, rollout.agent.default_agent_loop)
