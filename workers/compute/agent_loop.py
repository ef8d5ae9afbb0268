"""Multi-turn rollout with tools (the ``tool_agent`` loop), token-exact: the conversation the model is trained on is
the token stream it sampled from, turn by turn.

A ``TurnSampler`` (``workers.compute.turn_sampler``: the actor's own module by default) samples each row's assistant
turns. When a row's turn ends, its sampled ids are kept verbatim; the turn's text is parsed for hermes tool calls
(``workers.tools.parser``), the calls of all rows that ended a turn at once run together
(``workers.tools.ToolBox``), and the tool turn's ids come from ``workers.tools.turns.TurnBuilder`` (the template's
turn end after the stop token, the tool messages and the next generation prompt, never re-rendering the model's
text). A row stops when its turn has no call (``answer``), at ``max_assistant_turns`` / ``max_user_turns``
(``turn_limit``), or when the response budget cannot hold the next tool turn or is used up (``length_limit``).

Each row's ``AgentData`` (what tools see) records the stream as it is built: ``prompt_ids`` (prompt, then every
turn's ids) and ``response_mask``. At the end the training tensors are compared with it (by
``tokenization_sanity_check_mode``: ``strict`` ids, ``ignore_strippable`` text without whitespace, ``disable``):
a difference is counted (``multi_turn/tokenization_mismatch_ratio``, 0 by construction) and the first printed.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor, nn

from planner.phases import PROMPT
from workers.compute.decode_loop import rollout_batch
from workers.compute.turn_sampler import HFTurnSampler, LogitsProcessor, TurnSampler
from workers.tools import AgentData, ToolBox, ToolConfigError, load_tools
from workers.tools.parser import parse_tool_calls
from workers.tools.session import schema_of
from workers.tools.turns import TemplateError, TurnBuilder

TOOL_AGENT = "tool_agent"


@dataclass
class Trajectory(AgentData):
    """One row while it is rolled out: its ``AgentData`` (what its tools see) and the loop's own state."""

    uses_tools: bool = False
    prompt_length: int = 0
    tool_tokens: int = 0
    stop: str = "length_limit"  # answer | turn_limit | length_limit
    mismatch: bool = False

    @property
    def length(self) -> int:
        """Response tokens so far, sampled and fed."""
        return len(self.response_mask)

    def add(self, ids: list[int], sampled: bool) -> None:
        self.prompt_ids += ids
        self.response_mask += [int(sampled)] * len(ids)


class AgentLoop:
    """The multi-turn rollout of one worker: ``tokenizer``'s chat template, the tools and ``rollout.multi_turn``."""

    def __init__(self, tokenizer: Any, toolbox: ToolBox, multi_turn: Any, default_agent: str) -> None:
        self.tokenizer, self.toolbox, self.config, self.default_agent = tokenizer, toolbox, multi_turn, default_agent
        self.builder = TurnBuilder(tokenizer, toolbox.schemas)
        self.trajectories: list[Trajectory] = []
        self.response_length, self.eos_ids = 0, ()

    def generate(
        self,
        model: nn.Module | TurnSampler,
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
        """Roll out every row of ``batch`` (input_ids, attention_mask, position_ids (B, P)) with ``model`` (a
        module: ``HFTurnSampler``; or any ``TurnSampler``).

        ``non_tensors`` may hold ``raw_prompt``, ``agent_name`` and ``tools_kwargs`` per row. Returns the rollout
        tensors (as ``workers.compute.rollout.generate_sequences``: with ``return_log_probs`` rollout_log_probs, 0 on
        tool tokens), per-row non-tensors (``__num_turns__``, ``tool_call_counts``, ``tool_error_counts``,
        ``tool_rewards``, ``reward_scores``, ``tool_response_tokens``, ``stop_reason``, ``tokenization_mismatch``,
        ``messages``) and worker metrics.
        """
        sampler = model if isinstance(model, TurnSampler) else HFTurnSampler(model, logits_processor)
        size = batch["input_ids"].shape[0]
        column = lambda key, default: non_tensors.get(key, [default] * size)  # noqa: E731
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]
        self.trajectories = [
            self._trajectory(*row)
            for row in zip(
                prompts, column("raw_prompt", None), column("agent_name", None), column("tools_kwargs", None)
            )
        ]
        self.response_length, self.eos_ids, seconds = response_length, tuple(eos_token_id), self.toolbox.seconds
        out = sampler(
            *(batch[k] for k in PROMPT),
            response_length=response_length,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            end_turns=self._end_turns,
            sampling=sampling,
            return_log_probs=return_log_probs,
        )
        responses, model_mask, valid = (x.cpu() for x in (out.responses, out.model_mask, out.valid))
        self._close_cut_turns(responses, valid, out.finished.cpu())
        # the attention mask covers every real token (tool tokens too), the response mask the model's only
        tensors = rollout_batch(*(batch[k].cpu() for k in PROMPT), responses, valid)
        tensors["response_mask"] = model_mask * valid
        self._check_tokens(tensors)
        if return_log_probs:  # the old log-probs of an on-policy step; tool tokens are masked out of every loss
            tensors["rollout_log_probs"] = out.log_probs.cpu()
        metrics = {"timing_s/agent_loop/tool_calls": self.toolbox.seconds - seconds}
        return tensors, self._row_stats(), metrics

    def _trajectory(self, prompt: list[int], raw_prompt: Any, agent_name: Any, tools_kwargs: Any) -> Trajectory:
        uses_tools = (agent_name or self.default_agent) == TOOL_AGENT and isinstance(raw_prompt, (list, np.ndarray))
        messages = [dict(m) for m in raw_prompt] if uses_tools else []  # a plain-text prompt is one turn
        return Trajectory(
            messages=messages,
            tools_kwargs=dict(tools_kwargs or {}),
            prompt_ids=list(prompt),
            uses_tools=uses_tools,
            prompt_length=len(prompt),
        )

    def _end_turns(self, turns: dict[int, list[int]]) -> dict[int, list[int] | None]:
        """Rows whose assistant turn ended (its sampled ids, stop token last): finish them, or run their calls
        and answer with their tool turns' ids."""
        plans: dict[int, list[int] | None] = {}
        calling = []
        for row, ids in turns.items():
            trajectory = self.trajectories[row]
            trajectory.add(ids, sampled=True)
            trajectory.response_ids = list(ids)
            trajectory.assistant_turns += 1
            text = self.tokenizer.decode(ids[:-1], skip_special_tokens=False)
            calls = parse_tool_calls(text) if trajectory.uses_tools else []
            trajectory.tool_calls = calls
            if trajectory.uses_tools:
                trajectory.messages.append({"role": "assistant", "content": text})
            limits = (
                (self.config.max_assistant_turns, trajectory.assistant_turns),
                (self.config.max_user_turns, trajectory.user_turns),
            )
            if not calls or any(limit is not None and count >= limit for limit, count in limits):
                trajectory.stop, plans[row] = "turn_limit" if calls else "answer", None
                continue
            calling.append((row, calls))
        replies = self.toolbox.run_turn([(self.trajectories[row], calls) for row, calls in calling])
        for (row, _), messages in zip(calling, replies):
            plans[row] = self._tool_turn(self.trajectories[row], [{"role": "tool", "content": m} for m in messages])
        return plans

    def _tool_turn(self, trajectory: Trajectory, tool_messages: list[dict]) -> list[int] | None:
        """The tool turn's ids (None when it does not fit with a token to spare for the model)."""
        ids = self.builder.tool_turn(tool_messages, trajectory.response_ids[-1], self.eos_ids)
        if len(ids) >= self.response_length - trajectory.length:
            trajectory.stop = "length_limit"
            return None
        trajectory.messages += tool_messages
        trajectory.user_turns += 1
        trajectory.tool_tokens += len(ids)
        trajectory.add(ids, sampled=False)
        return ids

    def _close_cut_turns(self, responses: Tensor, valid: Tensor, finished: Tensor) -> None:
        """A row cut by the budget mid-turn: its partial turn counts, and joins its record and conversation."""
        for row, trajectory in enumerate(self.trajectories):
            if finished[row]:
                continue
            turn = responses[row, trajectory.length :][valid[row, trajectory.length :].bool()].tolist()
            trajectory.add(turn, sampled=True)
            trajectory.assistant_turns += 1
            if trajectory.uses_tools:
                text = self.tokenizer.decode(turn, skip_special_tokens=False)
                trajectory.messages.append({"role": "assistant", "content": text})

    def _check_tokens(self, tensors: dict[str, Tensor]) -> None:
        """The tokenization sanity check, token-exact: each row's training ids (and which of them are trained on)
        equal the stream its turns were built from (``AgentData.prompt_ids``, ``response_mask``)."""
        mode = self.config.tokenization_sanity_check_mode
        if mode == "disable":
            return
        length = tensors["responses"].shape[1]
        for row, trajectory in enumerate(self.trajectories):
            real = tensors["attention_mask"][row].bool()
            ours = tensors["input_ids"][row][real].tolist()
            trained = tensors["response_mask"][row][real[-length:]].tolist()
            if mode == "strict":
                same = ours == trajectory.prompt_ids and trained == trajectory.response_mask
            else:  # ignore_strippable: the texts agree once whitespace is removed
                same = self._stripped(ours) == self._stripped(trajectory.prompt_ids)
            trajectory.mismatch = not same
            if not same and not any(t.mismatch for t in self.trajectories[:row]):
                at = next((i for i, (a, b) in enumerate(zip(ours, trajectory.prompt_ids)) if a != b), len(ours))
                print(
                    f"[colorl] warning: multi-turn row {row}'s training tokens differ from its turns' at token {at} "
                    f"(trained {self.tokenizer.decode(ours[at : at + 8])!r}, built "
                    f"{self.tokenizer.decode(trajectory.prompt_ids[at : at + 8])!r}); see "
                    "multi_turn.tokenization_sanity_check_mode",
                    file=sys.stderr,
                    flush=True,
                )

    def _stripped(self, ids: list[int]) -> str:
        return re.sub(r"\s+", "", self.tokenizer.decode(ids, skip_special_tokens=False))

    def _row_stats(self) -> dict[str, np.ndarray]:
        def column(values: list) -> np.ndarray:
            out = np.empty(len(values), dtype=object)
            out[:] = values
            return out

        ts = self.trajectories
        return {
            "__num_turns__": column([t.assistant_turns + t.user_turns + 1 for t in ts]),
            "tool_call_counts": column([t.call_count for t in ts]),
            "tool_error_counts": column([t.error_count for t in ts]),
            "tool_rewards": column([float(sum(t.tool_rewards)) for t in ts]),
            "reward_scores": column([dict(t.reward_scores) for t in ts]),
            "tool_response_tokens": column([t.tool_tokens for t in ts]),
            "stop_reason": column([t.stop for t in ts]),
            "tokenization_mismatch": column([t.mismatch for t in ts]),
            "messages": column([t.messages for t in ts]),  # the conversation (prompt, turns, tool answers)
        }


def check_tools(tokenizer: Any, multi_turn: Any) -> list[dict]:
    """Load ``multi_turn``'s tools (running the code their config names, as each rollout worker will) and check
    that ``tokenizer``'s chat template builds a tool turn turn by turn; returns the tools' schemas.
    ToolConfigError otherwise."""
    tools = load_tools(multi_turn.tool_config_path, multi_turn.function_tool_path)
    schemas = [schema_of(tool) for tool in tools.values()]
    try:
        TurnBuilder(tokenizer, schemas).tool_text([{"role": "tool", "content": "r"}])
    except TemplateError as exc:
        raise ToolConfigError(
            f"the model's chat template cannot be built turn by turn: {exc} "
            "(python -m workers.tools.check_template MODEL_DIR says more)",
            "enable",
        ) from None
    return schemas


def build_agent_loop(tokenizer: Any, rollout: Any) -> AgentLoop:
    """The agent loop of ``rollout`` (the ``actor_rollout_ref.rollout`` config): its tools loaded from
    ``multi_turn.tool_config_path`` / ``function_tool_path`` (which runs the code they name)."""
    multi_turn = rollout.multi_turn
    tools = load_tools(multi_turn.tool_config_path, multi_turn.function_tool_path)
    return AgentLoop(tokenizer, ToolBox(tools, multi_turn), multi_turn, rollout.agent.default_agent_loop)
