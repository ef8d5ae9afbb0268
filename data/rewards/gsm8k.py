"""GSM8K's rule-based reward: the final number of a response against the reference answer.

GSM8K solutions end with ``#### <answer>`` (``... = 42 #### 42``), and the prompts ask the model to answer the
same way. Two extraction modes:

- ``strict``: the number after the last ``####`` (``$`` and thousands separators allowed); none -> no answer.
- ``flexible``: the last number anywhere in the text (for models that do not follow the format).

``compute_score`` gives ``score`` for a correct answer, ``format_score`` for a wrong one that could be extracted,
and 0 when nothing could be extracted.
"""

from __future__ import annotations

import re
from typing import Any

DATA_SOURCE = "openai/gsm8k"
METHODS = ("strict", "flexible")

# An optionally signed number with optional decimals, commas only as thousands separators: -1,234.5 (but "1,2,3" is
# three numbers). A trailing "." (the end of a sentence) is not part of the number.
_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
_STRICT = re.compile(r"####\s*\$?\s*(" + _NUMBER + r")")
_FLEXIBLE = re.compile(_NUMBER)


def extract_answer(text: str, method: str = "strict") -> str | None:
    """The final answer in ``text`` with commas removed (``"1,234"`` -> ``"1234"``), or None when there is none."""
    if method not in METHODS:
        raise ValueError(f"unknown GSM8K extraction method {method!r}; use one of {METHODS}")
    found = (_STRICT if method == "strict" else _FLEXIBLE).findall(text)
    return found[-1].replace(",", "") if found else None


def _same_number(answer: str, ground_truth: str) -> bool:
    """Equal as numbers (``"42.0"`` == ``"42"``), or as strings when either is not a number."""
    truth = ground_truth.replace(",", "").replace("$", "").strip()
    try:
        return float(answer) == float(truth)
    except ValueError:
        return answer == truth


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """``score`` if the extracted answer equals ``ground_truth``, ``format_score`` if it differs, 0 if absent."""
    answer = extract_answer(solution_str, method)
    if answer is None:
        return 0.0
    return score if _same_number(answer, str(ground_truth)) else format_score


def compute_score_by_source(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    """The reward-manager signature: strict extraction, 1 for a correct answer and 0 otherwise (the default)."""
    return compute_score(solution_str, ground_truth)
