"""Reward of the ``reasoning-gym`` tasks (``data_source`` ``reasoning_gym/<task>``): the package's own checker.

The answer is the text inside the response's last ``<answer>...</answer>`` (the format of reasoning-gym's system
prompt), scored by the task's ``score_answer`` against the generated entry that ``data.preprocess.reasoning_gym``
stores as JSON in ``extra_info["entry"]`` (some checkers read its metadata, e.g. countdown's numbers). No answer
tags: 0. reasoning-gym is an optional extra (``pip install -e '.[reasoning_gym]'``; ``make setup`` installs it).
"""

from __future__ import annotations

import json
from typing import Any

DATA_SOURCE_PREFIX = "reasoning_gym/"
INSTALL = "pip install -e '.[reasoning_gym]' (make setup installs it)"


def import_reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError(f"the reasoning_gym/* data sources need the reasoning-gym package: {INSTALL}") from None
    return reasoning_gym


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    """reasoning-gym's score in [0, 1] of the response's ``<answer>`` for the task named by ``data_source``."""
    reasoning_gym = import_reasoning_gym()
    from reasoning_gym.utils import extract_answer

    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    entry = json.loads((extra_info or {}).get("entry") or "null") or {"answer": ground_truth, "metadata": {}}
    score = reasoning_gym.get_score_answer_fn(data_source[len(DATA_SOURCE_PREFIX) :])(answer=answer, entry=entry)
    return float(score)
