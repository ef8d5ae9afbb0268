"""Token-exact multi-turn building: the model's sampled ids are kept as they are; only what the chat template
writes between turns, and the tool turns themselves, are tokenised.

A conversation's tokens are built turn by turn: the prompt (rendered with the generation prompt, as the dataset
does), then each assistant turn's sampled ids verbatim (its stop token last), then each tool turn's ids. A tool
turn's ids are the tokens of

- the rest of the template's turn end after the stop token the model sampled: a template ends an assistant turn
  with a closing text (``<|im_end|>\\n`` for ChatML: Qwen, SmolLM2; ``<|eot_id|>`` for Llama 3), whose first token
  is a stop token; the model stops at it, so what follows it (``\\n`` for ChatML, nothing for Llama 3) is added.
  When the model stopped with another stop token (Llama 3's ``<|eom_id|>`` for ``<|eot_id|>``) the two are taken
  as the same; a stop token the template never ends a turn with gets the whole closing text after it;
- the template's rendering of the tool messages and the next generation prompt, as a difference of two renders
  that never contain the model's text: a stand-in conversation (a user turn and an assistant turn that called the
  tools) without and with the tool messages. So nothing the model wrote is ever re-rendered or re-tokenised,
  whatever the template does to earlier turns (Qwen3 drops old reasoning) and however the model split its text.

The closing text is read from the template (an assistant turn rendered with a marker as its content), so one
rule covers the families above; ``TemplateError`` says where a template cannot be built this way
(``python -m workers.tools.check_template`` checks a model's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MARKER = "COLORL-CONTENT-MARKER"  # stands for a message's content; found again in the rendered text
USER = {"role": "user", "content": "The question."}


def eos_token_ids(generation_config: Any, tokenizer: Any) -> list[int]:
    """EOS ids from the generation config (may list several, e.g. Llama-3 chat) and the tokenizer."""
    ids = set()
    gen_eos = getattr(generation_config, "eos_token_id", None)
    ids.update([gen_eos] if isinstance(gen_eos, int) else gen_eos or [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


class TemplateError(ValueError):
    """The chat template cannot be built turn by turn; the message says where."""


class TurnBuilder:
    """Tool turns' token ids for ``tokenizer``'s chat template, rendered with the tools' schemas."""

    def __init__(self, tokenizer: Any, tools: list[dict] | None = None) -> None:
        self.tokenizer, self.tools = tokenizer, tools or None
        self.closing_text = self._closing_text()
        ids = self.encode(self.closing_text)
        first = tokenizer.decode(ids[:1], skip_special_tokens=False)
        self.closing_id = ids[0] if ids and self.closing_text.startswith(first) else None
        self.after_closing = self.closing_text[len(first) :] if self.closing_id is not None else self.closing_text
        self._prefixes: dict[tuple[int, bool], str] = {}

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _closing_text(self) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template")
        try:
            text = self.render([USER, {"role": "assistant", "content": MARKER}], False)
        except Exception as exc:
            raise TemplateError(
                f"the chat template cannot render a user and an assistant turn: {_first(exc)}"
            ) from None
        if MARKER not in text:
            raise TemplateError("the chat template does not write an assistant message's content")
        return text[text.rindex(MARKER) + len(MARKER) :]

    def boundary(self, stop_id: int, stop_ids: Sequence[int]) -> str:
        """The template's text between the model's stop token ``stop_id`` and the next turn."""
        same = stop_id == self.closing_id or (stop_id in stop_ids and self.closing_id in stop_ids)
        return self.after_closing if same else self.closing_text

    def tool_turn(self, tool_messages: list[dict], stop_id: int, stop_ids: Sequence[int]) -> list[int]:
        """The ids that follow an assistant turn ending in ``stop_id``: the rest of its turn end, the tool messages
        and the generation prompt of the next assistant turn."""
        return self.encode(self.boundary(stop_id, stop_ids) + self.tool_text(tool_messages))

    def tool_text(self, tool_messages: list[dict]) -> str:
        """The template's text for ``tool_messages`` after an assistant turn, with the next generation prompt."""
        problems = []
        for with_calls in (True, False):  # some templates need the calls, some refuse them (Llama 3.1: one call)
            stand_in = [USER, _assistant(tool_messages, with_calls)]
            try:
                before = self._prefix(stand_in, len(tool_messages), with_calls)
                after = self.render(stand_in + tool_messages, True)
            except Exception as exc:
                problems.append(_first(exc))
                continue
            if after.startswith(before):
                return after[len(before) :]
            at = _common_prefix(before, after)
            problems.append(f"the earlier turns render as {before[at : at + 40]!r}, then as {after[at : at + 40]!r}")
        raise TemplateError(
            f"the chat template does not render {len(tool_messages)} tool message(s) as an addition to the "
            f"conversation before them: {'; '.join(problems)}"
        )

    def _prefix(self, stand_in: list[dict], tools: int, with_calls: bool) -> str:
        key = (tools, with_calls)
        if key not in self._prefixes:
            self._prefixes[key] = self.render(stand_in, False)
        return self._prefixes[key]


def _assistant(tool_messages: list[dict], with_calls: bool) -> dict:
    """A stand-in assistant turn that called one tool per tool message (with reasoning, which some templates
    keep only for the turns after the last user message: the stand-in renders alike with and without tools)."""
    message: dict[str, Any] = {"role": "assistant", "content": "", "reasoning_content": "Thinking."}
    if with_calls:
        message["tool_calls"] = [
            {
                "id": m.get("tool_call_id", f"call_{i}"),
                "type": "function",
                "function": {"name": m.get("name", "tool"), "arguments": {}},
            }
            for i, m in enumerate(tool_messages)
        ]
    return message


def _common_prefix(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _first(exc: Exception) -> str:
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
