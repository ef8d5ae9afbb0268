"""Whether a model's chat template can be built turn by turn, and where it cannot.

    python -m workers.tools.check_template MODEL_DIR [--tool-config YAML] [--function-tools PY]

The multi-turn rollout builds a conversation's tokens turn by turn (``workers.tools.turns``): the prompt, the
model's sampled ids verbatim, and per tool turn the rest of the template's turn end, the tool messages and the
next generation prompt. This command checks, for the model's tokenizer, chat template and stop tokens
(``generation_config.json``'s ``eos_token_id``, else the tokenizer's EOS), and with the tools' schemas:

1. turn end: the template ends an assistant turn with a text whose first token is a stop token (so the model
   can stop where the template ends its turn);
2. tool turn: one and two tool messages render as an addition to the conversation before them;
3. conversations: a model that writes exactly what the template shows (a call, one tool turn, the answer; two
   calls in a turn; two rounds; with a system message), built turn by turn, gives the tokens of the whole
   conversation rendered at once. Where it does not, the first differing turn and both texts are shown: the
   rollout still trains on what the model saw, but that is not what the template shows for the conversation
   (a template that rewrites earlier turns, such as one that drops old reasoning).

It prints one line per check and exits with 1 when one fails (2 cannot run without the first two).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workers.tools.turns import TemplateError, TurnBuilder, eos_token_ids

CALL = '<tool_call>{{"name": "calculator", "arguments": {{"expression": "{}"}}}}</tool_call>'
CONVERSATIONS = {
    "one call": [
        {"role": "user", "content": "What is 12 + 30?"},
        {"role": "assistant", "content": CALL.format("12 + 30")},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "#### 42"},
    ],
    "two calls in a turn": [
        {"role": "user", "content": "What are 2 * 3 and 4 * 5?"},
        {"role": "assistant", "content": CALL.format("2 * 3") + "\n" + CALL.format("4 * 5")},
        {"role": "tool", "content": "6"},
        {"role": "tool", "content": "20"},
        {"role": "assistant", "content": "#### 6, 20"},
    ],
    "two rounds, a system message": [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": "What is (2 + 3) * 4?"},
        {"role": "assistant", "content": CALL.format("2 + 3")},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "<think>\nNow times 4.\n</think>\n" + CALL.format("5 * 4")},
        {"role": "tool", "content": "20"},
        {"role": "assistant", "content": "#### 20"},
    ],
}


@dataclass
class Finding:
    check: str
    ok: bool
    detail: str


def check_template(tokenizer: Any, stop_ids: Sequence[int], tools: list[dict] | None = None) -> list[Finding]:
    """The findings of the checks in the module docstring, in order."""
    try:
        builder = TurnBuilder(tokenizer, tools)
    except TemplateError as exc:
        return [Finding("turn end", False, str(exc))]
    stop_ids = list(stop_ids)
    first = tokenizer.decode([builder.closing_id]) if builder.closing_id is not None else None
    ok = builder.closing_id in stop_ids
    detail = (
        f"an assistant turn ends with {builder.closing_text!r}: the model stops at {first!r}, then "
        f"{builder.after_closing!r} is added"
        if ok
        else f"an assistant turn ends with {builder.closing_text!r}, whose first token {first!r} is not a stop "
        f"token ({[tokenizer.decode([i]) for i in stop_ids]}): the model cannot stop where the template ends a turn"
    )
    findings = [Finding("turn end", ok, detail)]
    try:
        for count in (1, 2):
            builder.tool_text([{"role": "tool", "content": "42"}] * count)
    except TemplateError as exc:
        return [*findings, Finding("tool turn", False, str(exc))]
    shown = builder.tool_text([{"role": "tool", "content": "42"}])
    findings.append(Finding("tool turn", True, f"renders after an assistant turn as {shown!r}"))
    for name, messages in CONVERSATIONS.items():
        findings.append(Finding(f"conversation: {name}", *_compare(builder, messages, stop_ids)))
    return findings


def _compare(builder: TurnBuilder, messages: list[dict], stop_ids: list[int]) -> tuple[bool, str]:
    """Build ``messages`` turn by turn as the rollout would, the model writing what the template shows, and
    compare with the whole conversation rendered at once; (same, where they differ)."""
    start = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids, turns, k = builder.encode(builder.render(messages[:start], True)), [(0, "the prompt")], start
    while k < len(messages):
        turns.append((len(ids), f"turn {k} ({messages[k]['role']})"))
        if messages[k]["role"] != "assistant":  # the tool turn after the model's stop token
            end = next((j for j in range(k, len(messages)) if messages[j]["role"] == "assistant"), len(messages))
            ids += builder.tool_turn(messages[k:end], ids[-1], stop_ids)
            k = end
            continue
        before, upto = builder.render(messages[:k], True), builder.render(messages[: k + 1], False)
        if not upto.startswith(before):
            at = _common(before, upto)
            return False, (
                f"turn {k} (assistant): the generation prompt ends {before[max(0, at - 20) : at + 20]!r}, but the "
                f"template starts the turn as {upto[max(0, at - 20) : at + 20]!r}"
            )
        written = upto[len(before) :]  # its content and the template's turn end: the model stops at the end's start
        if builder.closing_id is not None:
            ids += builder.encode(written.removesuffix(builder.after_closing))
        else:
            ids += builder.encode(written.removesuffix(builder.closing_text)) + [stop_ids[0]]
        k += 1
    whole = builder.encode(builder.render(messages, False))
    if whole[: len(ids)] == ids:
        return True, "built turn by turn = the whole conversation"
    at = next((i for i, (a, b) in enumerate(zip(ids, whole)) if a != b), min(len(ids), len(whole)))
    where = next(label for position, label in reversed(turns) if position <= at)
    decode = lambda part: builder.tokenizer.decode(part, skip_special_tokens=False)  # noqa: E731
    lo = max(0, at - 8)  # a little context before the first difference
    return False, (
        f"{where} differs at token {at}: turn by turn {decode(ids[lo : at + 12])!r}, the whole conversation "
        f"{decode(whole[lo : at + 12])!r}"
    )


def _common(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a Hugging Face model directory (its tokenizer and generation_config.json)")
    parser.add_argument("--tool-config", default=None, help="a tool YAML: render with its tools' schemas")
    parser.add_argument("--function-tools", default=None, help="a Python file of @function_tool functions")
    args = parser.parse_args(argv)
    # a command line, like main.py: it preloads the door, so a tool file that main.py loads loads here too
    os.environ.setdefault("COLORL_PRELOAD", "verl_compat.tools")
    from transformers import AutoTokenizer, GenerationConfig

    from workers.tools.registry import load_tools
    from workers.tools.session import schema_of

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    try:
        generation_config = GenerationConfig.from_pretrained(args.model)
    except OSError:  # no generation_config.json: the tokenizer's EOS
        generation_config = None
    tools = load_tools(args.tool_config, args.function_tools)
    schemas = [schema_of(tool) for tool in tools.values()]
    findings = check_template(tokenizer, eos_token_ids(generation_config, tokenizer), schemas)
    for finding in findings:
        print(f"{'ok  ' if finding.ok else 'FAIL'} {finding.check}: {finding.detail}")
    good = all(f.ok for f in findings) and len(findings) > 2
    print(f"{args.model}: {'can' if good else 'cannot'} be built turn by turn")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
