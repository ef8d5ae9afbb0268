"""reasoning-gym's procedural tasks in the dataset's layout, offline: ``python -m data.preprocess.reasoning_gym
--task NAME --out_dir DIR``.

reasoning-gym (PyPI ``reasoning-gym``, the ``reasoning_gym`` extra) generates problems from a seed, with no
download: ``basic_arithmetic``, ``chain_sum``, ``countdown``, ``gsm_symbolic`` and about a hundred more
(``--list`` names them). Each row::

    {"data_source": "reasoning_gym/chain_sum", "ability": "reasoning",
     "prompt": [{"role": "system", "content": reasoning-gym's default system prompt}, {"role": "user", "content": q}],
     "reward_model": {"style": "rule", "ground_truth": "-4"},
     "extra_info": {"split": "train", "index": 0, "entry": "<the generated entry as JSON>"}}

scored by the task's own checker on the response's ``<answer>...</answer>`` (``data.rewards.reasoning_gym``).
The test split comes from another seed, without any question of the train split. ``--config key=value`` sets
the task's generator options (e.g. ``max_terms=3``, values parsed as JSON where they can be); ``--tools`` makes
the rows ``tool_agent`` rows whose system prompt offers the calculator (``conf/tools/calculator.yaml``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import pyarrow.parquet as pq

from data.preprocess.splits import write_splits
from data.rewards.reasoning_gym import DATA_SOURCE_PREFIX, import_reasoning_gym

SEED_STRIDE = 10_000_019  # between the splits' seeds: more items than any split holds
TOOL_HINT = (
    '\nYou may use a calculator first: write <tool_call>{"name": "calculator", "arguments": {"expression": '
    '"12 * (3 + 4)"}}</tool_call> and it replies with the result.'
)


def parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``key=value`` strings as generator options; a value is JSON when it parses (``3``, ``true``, ``["+"]``)."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--config {pair!r}: expected key=value")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def make_row(task: str, entry: dict[str, Any], split: str, index: int, system: str, tools: bool) -> dict[str, Any]:
    row = {
        "data_source": DATA_SOURCE_PREFIX + task,
        "prompt": [
            {"role": "system", "content": system + (TOOL_HINT if tools else "")},
            {"role": "user", "content": entry["question"]},
        ],
        "ability": "reasoning",
        "reward_model": {"style": "rule", "ground_truth": str(entry["answer"])},
        "extra_info": {"split": split, "index": index, "entry": json.dumps(entry, default=str)},
    }
    return {**row, "agent_name": "tool_agent"} if tools else row


def make_splits(
    task: str, sizes: dict[str, int], seed: int = 0, options: dict[str, Any] | None = None, tools: bool = False
) -> dict[str, list[dict[str, Any]]]:
    """Rows of every split (split -> size); split k is generated from ``seed + k·SEED_STRIDE`` (reasoning-gym seeds
    item i from seed + i, so nearby seeds repeat items) and skips the questions of the splits before it."""
    reasoning_gym = import_reasoning_gym()
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if task not in reasoning_gym.factory.DATASETS:
        raise ValueError(f"--task {task!r} is not a reasoning-gym task; --list names them")
    seen: set[str] = set()
    splits = {}
    for k, (split, size) in enumerate(sizes.items()):
        try:  # twice the size: room for the questions an earlier split already has
            dataset = reasoning_gym.create_dataset(task, size=2 * size, seed=seed + k * SEED_STRIDE, **(options or {}))
        except (TypeError, ValueError, AssertionError) as exc:
            raise ValueError(f"--config {options}: reasoning-gym refused it for {task!r}: {exc}") from None
        entries = [e for e in dataset if e["question"] not in seen][:size]
        if len(entries) < size:
            raise ValueError(
                f"only {len(entries)} new {task!r} problems for the {split} split of {size}; "
                "ask for fewer or widen the task with --config"
            )
        seen.update(e["question"] for e in entries)
        splits[split] = [make_row(task, e, split, i, SYSTEM_PROMPTS["default"], tools) for i, e in enumerate(entries)]
    return splits


def main(argv: Sequence[str] | None = None) -> None:
    """The command line; an unknown task or a refused option is one line on stderr and exit status 2."""
    parser = argparse.ArgumentParser(
        prog="python -m data.preprocess.reasoning_gym", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--task", help="a reasoning-gym task, e.g. chain_sum, basic_arithmetic, countdown, gsm_symbolic"
    )
    parser.add_argument("--out_dir", default=None, help="where train.parquet/test.parquet go (~/data/<task>)")
    parser.add_argument("--train_size", type=int, default=1000)
    parser.add_argument("--test_size", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="the problems are a function of the seed")
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE", help="the task generator's options")
    parser.add_argument("--tools", action="store_true", help="tool_agent rows offering the calculator")
    parser.add_argument("--list", action="store_true", help="print the task names and exit")
    args = parser.parse_args(argv)
    try:
        reasoning_gym = import_reasoning_gym()
        if args.list or not args.task:
            print(" ".join(sorted(reasoning_gym.factory.DATASETS)))
            return
        splits = make_splits(
            args.task,
            {"train": args.train_size, "test": args.test_size},
            args.seed,
            parse_options(args.config),
            args.tools,
        )
        written = write_splits(splits, args.out_dir or f"~/data/{args.task}")
    except (OSError, ValueError, ImportError) as exc:
        parser.exit(2, f"reasoning_gym: error: {exc}\n")
    for split, path in written.items():
        print(f"{split}: {pq.read_metadata(path).num_rows} rows -> {path}")


if __name__ == "__main__":
    main()
