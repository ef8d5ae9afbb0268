"""Per-step training metrics computed on the driver from a batch's tensors (a Mapping[str, Tensor]).

The metric names are part of the API: dashboards and the health checks read them by name (the table
"Metrics, dumps and logs" in docs/ lists them). All results are Python floats.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

# the tokens timing_per_token_ms/<phase> divides a phase's time by (phases of planner.phases.STEP_PHASES, by name):
# the response tokens (tool turns included: the rollout feeds them) or all of prompt + response
PER_TOKEN = {
    "gen": "response",
    "old_log_prob": "all",
    "ref": "all",
    "teacher": "all",
    "values": "all",
    "adv": "all",
    "update_critic": "all",
    "update_actor": "all",
}


def _stats(prefix: str, values: Tensor) -> dict[str, Tensor]:
    """{prefix/mean, prefix/max, prefix/min} of a 1-D tensor; NaN when it is empty (e.g. no valid tokens)."""
    if values.numel() == 0:
        nan = torch.tensor(float("nan"))
        return {f"{prefix}/mean": nan, f"{prefix}/max": nan, f"{prefix}/min": nan}
    values = values.float()
    return {f"{prefix}/mean": values.mean(), f"{prefix}/max": values.max(), f"{prefix}/min": values.min()}


def _length_stats(prefix: str, lengths: Tensor, max_length: int) -> dict[str, Tensor]:
    """Length stats plus clip_ratio = fraction of sequences that hit ``max_length`` (truncated)."""
    return {**_stats(prefix, lengths), f"{prefix}/clip_ratio": (lengths == max_length).float().mean()}


def _explained_var(returns: Tensor, values: Tensor) -> Tensor:
    """1 − Var(R − V)/Var(R) over valid tokens: 1 is a perfect critic, 0 no better than a constant."""
    if returns.numel() < 2:
        return torch.tensor(float("nan"))
    return 1.0 - torch.var(returns - values) / (torch.var(returns) + 1e-5)


def compute_data_metrics(batch: Mapping[str, Tensor], use_critic: bool) -> dict[str, float]:
    """Score, reward, advantage, return (and value) statistics plus prompt/response lengths.

    Needs token_level_scores, token_level_rewards, advantages, returns, response_mask (bs, R), attention_mask
    (bs, P + R), responses (bs, R), and values (bs, R) when ``use_critic``. Token-level quantities are taken over
    valid response tokens; score and rewards are per-sequence sums.
    """
    response_length = batch["responses"].shape[-1]
    response_mask = batch["response_mask"].bool()
    prompt_mask = batch["attention_mask"][:, :-response_length].bool()
    # a response's length counts every real token: with tool calls it holds tool turns the mask leaves out
    response_tokens = batch["attention_mask"][:, -response_length:]
    valid_returns = batch["returns"][response_mask]

    metrics = {
        **_stats("critic/score", batch["token_level_scores"].sum(-1)),
        **_stats("critic/rewards", batch["token_level_rewards"].sum(-1)),
        **_stats("critic/advantages", batch["advantages"][response_mask]),
        **_stats("critic/returns", valid_returns),
    }
    if use_critic:
        valid_values = batch["values"][response_mask]
        metrics |= _stats("critic/values", valid_values)
        metrics["critic/vf_explained_var"] = _explained_var(valid_returns.float(), valid_values.float())
    metrics |= _length_stats("response_length", response_tokens.sum(-1).float(), response_length)
    metrics |= _length_stats("prompt_length", prompt_mask.sum(-1).float(), prompt_mask.shape[-1])
    return {name: float(value) for name, value in metrics.items()}


def rollout_probs_diff(batch: Mapping[str, Tensor]) -> dict[str, float]:
    """The sampler-vs-learner gap (``training/rollout_probs_diff_*``): |π_rollout(y_t) − π_actor(y_t)| over the
    sampled response tokens, from ``rollout_log_probs`` (the rollout engine's) and ``old_log_probs`` (the actor's
    forward) (B, R), and the Pearson correlation of the two probabilities (``training/rollout_actor_probs_
    pearson_corr``). ~0 when the rollout computes with the actor's own module; larger with another engine's
    kernels (vLLM), another precision, or stale weights. {} without both inputs; NaN without response tokens."""
    if "rollout_log_probs" not in batch or "old_log_probs" not in batch:
        return {}
    mask = batch["response_mask"].bool()
    rollout, actor = (batch[k].float().exp()[mask] for k in ("rollout_log_probs", "old_log_probs"))
    prefix = "training/rollout_probs_diff"
    if rollout.numel() == 0:
        keys = (f"{prefix}_max", f"{prefix}_mean", f"{prefix}_std", "training/rollout_actor_probs_pearson_corr")
        return {f"{prefix}_valid": 0.0, **dict.fromkeys(keys, float("nan"))}
    diff = (rollout - actor).abs()
    return {
        f"{prefix}_valid": 1.0,
        f"{prefix}_max": float(diff.max()),
        f"{prefix}_mean": float(diff.mean()),
        f"{prefix}_std": float(diff.std()) if diff.numel() > 1 else 0.0,
        "training/rollout_actor_probs_pearson_corr": float(torch.corrcoef(torch.stack([actor, rollout]))[0, 1]),
    }


def reward_group_metrics(scores: Tensor, uids: Sequence[Hashable]) -> dict[str, float]:
    """``health/frac_reward_zero_std`` (TRL's ``frac_reward_zero_std``): the share of prompt groups (rows sharing a
    uid: one prompt's n responses) whose scores (B,) are all equal. GRPO's advantages are zero there, so those
    prompts teach nothing. Empty without groups of two or more responses."""
    groups: dict[Hashable, list[float]] = {}
    for uid, score in zip(uids, scores.tolist()):
        groups.setdefault(uid, []).append(score)
    groups_of_several = [group for group in groups.values() if len(group) > 1]
    if not groups_of_several:
        return {}
    return {"health/frac_reward_zero_std": statistics.fmean(float(max(g) == min(g)) for g in groups_of_several)}


def compute_timing_metrics(batch: Mapping[str, Tensor], timing_raw: Mapping[str, float]) -> dict[str, float]:
    """timing_s/<name> for every timer, and timing_per_token_ms/<name> for the phases that process tokens: each
    divided by the tokens ``PER_TOKEN`` names for it (the response tokens, or all of prompt + response)."""
    tokens = {
        "response": max(int(batch["attention_mask"][:, -batch["responses"].shape[-1] :].sum()), 1),
        "all": max(int(batch["attention_mask"].sum()), 1),
    }
    metrics = {f"timing_s/{name}": float(seconds) for name, seconds in timing_raw.items()}
    for phase, counted in PER_TOKEN.items():
        if phase in timing_raw:
            metrics[f"timing_per_token_ms/{phase}"] = timing_raw[phase] * 1000.0 / tokens[counted]
    return metrics


def compute_throughput_metrics(
    batch: Mapping[str, Tensor], timing_raw: Mapping[str, float], n_workers: int
) -> dict[str, float]:
    """perf/total_num_tokens, perf/time_per_step (= timing_raw["step"]) and perf/throughput (tokens/s per worker)."""
    total_tokens = int(batch["attention_mask"].sum())
    step_time = float(timing_raw["step"])
    return {
        "perf/total_num_tokens": float(total_tokens),
        "perf/time_per_step": step_time,
        "perf/throughput": total_tokens / (step_time * n_workers),
    }


def multi_turn_metrics(rows: Mapping[str, Any]) -> dict[str, float]:
    """Tool-use statistics of a multi-turn rollout from its per-row values (``workers.compute.agent_loop``); {} without.

    ``num_turns/{mean,min,max}`` (user, assistant and tool turns) and ``tool_call_counts/{mean,min,max}``
    per trajectory; ColoRL's ``multi_turn/``: tool errors and tool-output tokens per trajectory, the share of
    calls that succeeded, of trajectories stopped by the turn or the length limit, and of trajectories whose
    turn-by-turn tokens differ from the whole conversation's tokenization, and the mean tool step reward.
    """
    if "__num_turns__" not in rows:
        return {}
    column = {
        k: torch.tensor([float(v) for v in rows[k]])
        for k in (
            "__num_turns__",
            "tool_call_counts",
            "tool_error_counts",
            "tool_response_tokens",
            "tool_rewards",
            "tokenization_mismatch",
        )
    }
    stops = list(rows["stop_reason"])
    metrics = {
        **_stats("num_turns", column["__num_turns__"]),
        **_stats("tool_call_counts", column["tool_call_counts"]),
        "multi_turn/tool_errors/mean": column["tool_error_counts"].mean(),
        "multi_turn/tool_response_tokens/mean": column["tool_response_tokens"].mean(),
        "multi_turn/tool_reward/mean": column["tool_rewards"].mean(),
        "multi_turn/turn_limit_ratio": torch.tensor(stops.count("turn_limit") / len(stops)),
        "multi_turn/length_limit_ratio": torch.tensor(stops.count("length_limit") / len(stops)),
        "multi_turn/tokenization_mismatch_ratio": column["tokenization_mismatch"].mean(),
    }
    calls = column["tool_call_counts"].sum()
    if calls > 0:
        # errors also count failed create/calc_reward/release calls, hence the floor at 0
        metrics["multi_turn/tool_success_rate"] = (1 - column["tool_error_counts"].sum() / calls).clamp(min=0)
    return {name: float(value) for name, value in metrics.items()}


def reduce_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Mean of each list (e.g. one entry per micro-batch or worker); scalars pass through as floats. The
    distillation's extremes (``distillation/*_min``, ``*_max``) take the least or largest."""
    return {
        name: _reduce(name, [float(v) for v in value]) if isinstance(value, (list, tuple)) else float(value)
        for name, value in metrics.items()
    }


def _reduce(name: str, values: list[float]) -> float:
    if name.startswith("distillation/") and name.endswith(("_min", "_max")):
        return min(values) if name.endswith("_min") else max(values)
    return statistics.fmean(values)


class Timer:
    """Context manager measuring wall-clock seconds into ``.elapsed`` with time.perf_counter."""

    elapsed: float = 0.0

    def __enter__(self) -> Timer:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.elapsed = time.perf_counter() - self._start


@contextmanager
def timed(name: str, timing_raw: dict[str, float]) -> Iterator[Timer]:
    """``with timed("gen", timing_raw): ...`` adds the block's seconds to timing_raw[name].

    Adds rather than overwrites, so a phase timed twice in one step sums; use a fresh dict per step.
    The time is recorded even when the block raises.
    """
    timer = Timer()
    try:
        with timer:
            yield timer
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + timer.elapsed


def validation_metrics(
    sources: Sequence[str],
    rewards: Sequence[float],
    answers: Sequence[Hashable],
    n: int,
    extras: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, float]:
    """The validation metrics per data source, over groups of ``n`` consecutive rows (one prompt's responses).

    ``val-core/<source>/reward/mean@n``; with n > 1 also ``best@n/mean`` and ``maj@n/mean`` (val-core), ``std@n``
    and ``worst@n/mean`` (val-aux). best/worst: the max/min reward among a prompt's n responses; maj: the reward
    of its most frequent ``answer`` (ties: the first seen); std: of the n rewards. Each is averaged over prompts
    (exact over all n responses, not bootstrapped from subsets). Each other
    numeric per-row value a reward function returned (``extras``, e.g. a flexible score) is ``val-aux/<source>/
    <key>/mean@n``.
    """
    groups: dict[str, list[tuple[list[float], list[Hashable]]]] = {}
    for start in range(0, len(rewards), n):
        group = (list(rewards[start : start + n]), list(answers[start : start + n]))
        groups.setdefault(sources[start], []).append(group)
    metrics = {}
    for source, prompts in groups.items():
        core, aux = f"val-core/{source}/reward", f"val-aux/{source}/reward"
        metrics[f"{core}/mean@{n}"] = statistics.fmean(r for scores, _ in prompts for r in scores)
        if n > 1:
            majority = [scores[picks.index(Counter(picks).most_common(1)[0][0])] for scores, picks in prompts]
            metrics[f"{core}/best@{n}/mean"] = statistics.fmean(max(scores) for scores, _ in prompts)
            metrics[f"{core}/maj@{n}/mean"] = statistics.fmean(majority)
            metrics[f"{aux}/std@{n}"] = statistics.fmean(statistics.pstdev(scores) for scores, _ in prompts)
            metrics[f"{aux}/worst@{n}/mean"] = statistics.fmean(min(scores) for scores, _ in prompts)
    for key, values in (extras or {}).items():
        for source in groups:
            picked = [float(v) for s, v in zip(sources, values) if s == source]
            metrics[f"val-aux/{source}/{key}/mean@{n}"] = statistics.fmean(picked)
    return metrics
