"""Reward of the arithmetic word problems of ``data.preprocess.arith``: GSM8K's scorer.

The score is GSM8K's strict one (1 for ``#### <the right number>``, else 0). The flexible score (the last number
anywhere in the response) comes along as the extra per-row value ``flexible``: how often the model computes the
right number without following the format, i.e. how much of the strict reward's gap is format.
"""

from __future__ import annotations

from typing import Any

from data.rewards import gsm8k

DATA_SOURCE = "colorl/arith"


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> dict[str, float]:
    """``{"score": strict GSM8K score, "flexible": flexible GSM8K score}`` (each 1 for a correct answer, else 0)."""
    return {
        "score": gsm8k.compute_score(solution_str, ground_truth, "strict"),
        "flexible": gsm8k.compute_score(solution_str, ground_truth, "flexible"),
    }
