"""Built-in synthetic tasks with rule-based rewards (the offline demo).

A task maps a digit string to an answer: ``reverse`` turns ``r6475>`` into ``5746``, ``copy`` turns ``c604>``
into ``604``. Rows follow the prompt files' layout (``data.dataset``)::

    {"data_source": "colorl/reverse", "prompt": "r6475>",
     "reward_model": {"ground_truth": "5746"}, "extra_info": {"split": "train", "index": 0}}

How the reward learns that generation stopped: the reward manager decodes the valid response tokens WITHOUT
special tokens (the naive reward manager's reading, so ``compute_score`` functions written for it work unchanged)
and adds ``extra_info["stopped_by_eos"]``: True when the last valid token was the tokenizer's eos. A call
without the flag (e.g. by hand) treats ``solution_str`` as a finished answer.

``default_compute_score`` is the reward manager's default: it picks the reward by ``data_source`` among the
built-in tasks and the data sets of ``data/rewards/`` (GSM8K, the arithmetic word problems).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from data.rewards import arith, gsm8k, reasoning_gym

DATA_SOURCE_PREFIX = "colorl/"
# Half of the built-in reward is exact match: partial credit alone lets RL settle on "mostly right" answers
# (the recipe search saw greedy reward plateau below 0.9 without it).
EXACT_WEIGHT = 0.5
Score = float | dict[str, float]  # a reward, or a dict of its "score" and extra per-row values


@dataclass(frozen=True)
class Task:
    """A digit-string task: prompt ``{symbol}{digits}>``, answer ``solve(digits)``."""

    name: str
    symbol: str
    solve: Callable[[str], str]

    @property
    def data_source(self) -> str:
        return DATA_SOURCE_PREFIX + self.name


TASKS: dict[str, Task] = {
    "reverse": Task("reverse", "r", lambda digits: digits[::-1]),
    "copy": Task("copy", "c", lambda digits: digits),
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown built-in task {name!r}; known tasks: {sorted(TASKS)}")
    return TASKS[name]


def make_row(task: Task, digits: str, split: str, index: int) -> dict[str, Any]:
    """One dataset row for ``digits``."""
    return {
        "data_source": task.data_source,
        "prompt": f"{task.symbol}{digits}>",
        "reward_model": {"style": "rule", "ground_truth": task.solve(digits)},
        "extra_info": {"split": split, "index": index},
    }


def make_splits(
    task: str,
    num_train: int,
    num_val: int,
    seed: int = 1,
    min_digits: int = 3,
    max_digits: int = 5,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Deterministic train/val rows with distinct digit strings (val is held out from train).

    The length is drawn uniformly from [min_digits, max_digits], then each digit uniformly.
    """
    capacity = sum(10**n for n in range(min_digits, max_digits + 1))
    if num_train + num_val > capacity:
        raise ValueError(f"{num_train + num_val} distinct prompts requested, only {capacity} exist")
    spec = get_task(task)
    rng = random.Random(seed)
    seen: set[str] = set()
    strings: list[str] = []
    while len(strings) < num_train + num_val:
        length = rng.randint(min_digits, max_digits)
        digits = "".join(rng.choice("0123456789") for _ in range(length))
        if digits not in seen:
            seen.add(digits)
            strings.append(digits)
    train = [make_row(spec, d, "train", i) for i, d in enumerate(strings[:num_train])]
    val = [make_row(spec, d, "val", i) for i, d in enumerate(strings[num_train:])]
    return train, val


def partial_score(
    solution_str: str, ground_truth: str, stopped_by_eos: bool = True, exact_weight: float = 0.0
) -> float:
    """Partial credit against ``ground_truth + <eos>``, optionally mixed with exact match.

    partial = (#{i : solution[i] == answer[i]} + [stopped right after len(answer) chars])
              / (max(len(solution), len(answer)) + 1)
    score   = (1 - exact_weight) * partial + exact_weight * [solution == answer and stopped]

    Dividing by the longer length makes extra characters cost as much as wrong ones. Without that, a policy
    that never stops loses only the eos slot, and RL drifts into never emitting eos (the "eos collapse").
    """
    matches = sum(a == b for a, b in zip(solution_str, ground_truth))
    stopped_right = stopped_by_eos and len(solution_str) == len(ground_truth)
    partial = (matches + stopped_right) / (max(len(solution_str), len(ground_truth)) + 1)
    exact = float(stopped_right and solution_str == ground_truth)
    return (1.0 - exact_weight) * partial + exact_weight * exact


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    """Reward in [0, 1] of one response to a built-in task: ``partial_score`` with ``EXACT_WEIGHT``.

    See the module docstring for ``extra_info["stopped_by_eos"]``.
    """
    stopped = True if extra_info is None else bool(extra_info.get("stopped_by_eos", True))
    return partial_score(solution_str, ground_truth, stopped, EXACT_WEIGHT)


@functools.cache  # built once: the reward manager dispatches on it for every response
def _reward_table() -> dict[str, Callable[..., Score]]:
    return reward_functions()


def reward_functions() -> dict[str, Callable[..., Score]]:
    """Every data source with a rule-based reward -> its ``compute_score(data_source, solution_str, ground_truth,
    extra_info)``: the built-in tasks, GSM8K and the arithmetic word problems (whose score is a dict: GSM8K's strict
    ``score`` and the ``flexible`` one). This is the one table ``default_compute_score`` dispatches on."""
    functions: dict[str, Callable[..., Score]] = {task.data_source: compute_score for task in TASKS.values()}
    functions[gsm8k.DATA_SOURCE] = gsm8k.compute_score_by_source
    functions[arith.DATA_SOURCE] = arith.compute_score
    return functions


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> Score:
    """Dispatch on ``data_source`` to the matching rule-based reward (a float, or a dict with ``score``); the
    ``reasoning_gym/<task>`` sources go to that package's checker (``data.rewards.reasoning_gym``)."""
    if data_source.startswith(reasoning_gym.DATA_SOURCE_PREFIX):
        return reasoning_gym.compute_score(data_source, solution_str, ground_truth, extra_info)
    functions = _reward_table()
    if data_source not in functions:
        raise ValueError(
            f"no reward function for data_source {data_source!r}; known data sources: {sorted(functions)} and "
            f"{reasoning_gym.DATA_SOURCE_PREFIX}<task>. "
            "Pass a custom one with reward.custom_reward_function.path/name."
        )
    return functions[data_source](data_source, solution_str, ground_truth, extra_info)
