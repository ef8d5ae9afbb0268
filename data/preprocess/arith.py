"""Arithmetic word problems in GSM8K's layout, generated from a seed: ``python -m data.preprocess.arith --out_dir DIR``.

Each problem is one or more steps (``--max_steps``, default 1) of addition or subtraction of numbers from 1 to
``--max_number`` (default 20), told as a story that never goes below zero (``Mia has 13 marbles. Then Mia gives
away 7. How many marbles does Mia have now?``). The defaults are the ``smollm2_arith`` benchmark's task: problems
SmolLM2-135M-Instruct solves some of the time, so that RL has a signal to amplify; with two steps and numbers up
to 99 it is right far less often (docs/benchmarks.md, "A real model"). The rows follow
``data.preprocess.gsm8k``'s layout, so the GSM8K scorer grades them (strict ``#### N``)::

    {"data_source": "colorl/arith", "ability": "math",
     "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
     "reward_model": {"style": "rule", "ground_truth": "6"},
     "extra_info": {"split": "test", "index": 0, "answer": "13 - 7 = 6\\n#### 6", "question": question}}

No expression appears in two rows, so the test split is held out from the train split (one step up to 20 has
610 distinct expressions: the default sizes use most of them).

``--tools`` writes the same problems for the multi-turn rollout (``conf/smollm2_tools.yaml``): ``"agent_name":
"tool_agent"``, and before the question an example as earlier turns: a problem, the hermes calculator call and
the calculator's turn. The prompt shows the format itself because SmolLM2's chat template does not
render tool schemas (``tools=``); a template that does shows the model the schema as well.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from typing import Any

import pyarrow.parquet as pq

from data.preprocess.splits import write_splits
from data.rewards.arith import DATA_SOURCE

# The instruction and one worked example, as a system message: a 135 M model told only "end with ####" in the user
# turn rarely follows the format, and with the example in the user turn it tends to copy the example verbatim
# (docs/benchmarks.md, "A real model").
SYSTEM = (
    'You solve arithmetic word problems. Reply with the calculation and then "#### <number>", for example:\n'
    "5 + 3 - 2 = 6\n#### 6"
)
# The calculator variant: an example as earlier turns of the conversation (a question, the call, the calculator's
# turn). So untrained SmolLM2-135M-Instruct sometimes calls; with the format only described in the system message it
# does not, and with the example's answer turn too it copies that answer instead
# (docs/benchmarks_learning.md, "Tool use")
TOOL_SYSTEM = (
    "You solve arithmetic word problems with a calculator: call it with the problem's calculation, then "
    'reply with "#### <result>".'
)
TOOL_EXAMPLE = [
    {
        "role": "user",
        "content": "Ben has 12 pencils. Then Ben buys 30 more. Then Ben loses 5. How many pencils does Ben have now?",
    },
    {
        "role": "assistant",
        "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "12 + 30 - 5"}}</tool_call>',
    },
    {"role": "tool", "content": "37"},
]
MAX_STEPS = 1
MAX_NUMBER = 20
NAMES = ("Mia", "Tom", "Ava", "Leo", "Sara", "Ben", "Nora", "Omar", "Lily", "Sam")
ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "coins", "books", "shells")
# One sentence per step; ``{name}`` and ``{n}`` are filled in. Several phrasings, so that the policy must read.
STEPS = {
    "+": ("{name} finds {n} more.", "Then {name} buys {n} more.", "A friend gives {name} {n} more."),
    "-": ("{name} gives away {n}.", "Then {name} loses {n}.", "Then {name} uses {n} of them."),
}


def make_problem(rng: random.Random, max_steps: int = MAX_STEPS, max_number: int = MAX_NUMBER) -> tuple[str, str, int]:
    """(question, expression, result) of one problem: a start in [1, max_number], then 1..max_steps steps of +/- n
    with n in [1, max_number] and the running total never below 0."""
    name, items = rng.choice(NAMES), rng.choice(ITEMS)
    total = rng.randint(1, max_number)
    sentences, expression = [f"{name} has {total} {items}."], str(total)
    for _ in range(rng.randint(1, max_steps)):
        op = "+" if total == 0 else rng.choice("+-")
        n = rng.randint(1, max_number if op == "+" else min(total, max_number))
        total = total + n if op == "+" else total - n
        sentences.append(rng.choice(STEPS[op]).format(name=name, n=n))
        expression += f" {op} {n}"
    sentences.append(f"How many {items} does {name} have now?")
    return " ".join(sentences), expression, total


def make_row(
    question: str, expression: str, result: int, split: str, index: int, tools: bool = False
) -> dict[str, Any]:
    """One row in GSM8K's layout (``data.preprocess.gsm8k.make_row``), with a worked reference answer; with
    ``tools`` a tool_agent row whose prompt shows a worked calculator call first."""
    system = (
        [{"role": "system", "content": TOOL_SYSTEM}, *TOOL_EXAMPLE]
        if tools
        else [{"role": "system", "content": SYSTEM}]
    )
    row = {
        "data_source": DATA_SOURCE,
        "prompt": [*system, {"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(result)},
        "extra_info": {
            "split": split,
            "index": index,
            "answer": f"{expression} = {result}\n#### {result}",
            "question": question,
        },
    }
    return {**row, "agent_name": "tool_agent"} if tools else row


def make_splits(
    sizes: dict[str, int],
    seed: int = 0,
    max_steps: int = MAX_STEPS,
    max_number: int = MAX_NUMBER,
    tools: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """Rows of every split (split -> size), deterministic in ``seed``; no expression is in two rows."""
    if any(size < 0 for size in sizes.values()) or max_steps < 1 or max_number < 1:
        raise ValueError(
            f"split sizes must be >= 0, max_steps and max_number >= 1; got sizes={sizes}, "
            f"max_steps={max_steps}, max_number={max_number}"
        )
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[dict[str, Any]]] = {}
    tries = 0
    for split, size in sizes.items():
        rows = splits[split] = []
        while len(rows) < size:
            tries += 1
            if tries > 10 * sum(sizes.values()) + 1000:  # more distinct problems asked for than exist
                raise ValueError(
                    f"only {len(seen)} distinct problems found for sizes={sizes}, "
                    f"max_steps={max_steps}, max_number={max_number}"
                )
            question, expression, result = make_problem(rng, max_steps, max_number)
            if expression not in seen:
                seen.add(expression)
                rows.append(make_row(question, expression, result, split, len(rows), tools))
    return splits


def main(argv: Sequence[str] | None = None) -> None:
    """The command line; a bad size is one line on stderr and exit status 2."""
    parser = argparse.ArgumentParser(prog="python -m data.preprocess.arith", description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", default="~/data/arith", help="where train.parquet/test.parquet go")
    parser.add_argument("--train_size", type=int, default=500, help="train problems (default 500)")
    parser.add_argument("--test_size", type=int, default=100, help="held-out test problems (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="the problems are a function of the seed")
    parser.add_argument("--max_steps", type=int, default=MAX_STEPS, help="at most this many +/- steps per problem")
    parser.add_argument("--max_number", type=int, default=MAX_NUMBER, help="numbers in [1, max_number]")
    parser.add_argument("--tools", action="store_true", help="tool_agent rows for the calculator (multi-turn)")
    args = parser.parse_args(argv)
    try:
        sizes = {"train": args.train_size, "test": args.test_size}
        splits = make_splits(sizes, args.seed, args.max_steps, args.max_number, args.tools)
        written = write_splits(splits, args.out_dir)
    except (OSError, ValueError) as exc:
        parser.exit(2, f"arith: error: {exc}\n")
    for split, path in written.items():
        print(f"{split}: {pq.read_metadata(path).num_rows} rows -> {path}")


if __name__ == "__main__":
    main()
