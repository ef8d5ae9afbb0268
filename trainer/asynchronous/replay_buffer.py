"""The batches generation has been asked for ahead of training (``trainer.v1``'s async modes), oldest first.

The rollout group answers whole batches in the order they were asked for, so the buffer is a queue of them
(``colocate_async``'s partial rollouts keep groups instead: ``trainer.asynchronous.partial``). Each ``Generation``
holds the step that asked for it and the version of the weights that generate it: the number of training steps in
them (one version per batch).

The off-policy bounds are over a batch's span ``step - asked_at + 1`` at the step that would train it:
- ``drop``: a batch whose span exceeds ``max_off_policy_threshold`` is evicted, and the caller asks for as many
  fresh prompts in its place (evict k, refill k);
- ``wait``: no batch is asked for so far ahead that it would exceed the threshold: training waits for generation.
A null threshold bounds nothing. The metrics: ``training/off_policy/...``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.trainer_modes import TrainerMode

VERSION = "policy_version"  # the per-sample column: the version of the weights that generated the sample (its last)
# a partial rollout's (trainer.asynchronous.partial): the first version that generated it
FIRST_VERSION = "policy_version_first"
OFF_POLICY = "training/off_policy"


@dataclass
class Generation:
    """One batch asked of the rollout: ``result`` is what stands for it until taken (a future), then the batch."""

    asked_at: int
    version: int
    result: Any

    def span(self, step: int) -> int:
        """The span: the versions between the step that asked for the batch and ``step``, both counted."""
        return step - self.asked_at + 1


class ReplayBuffer:
    """The queue of ``Generation``s, oldest first, ``mode.lookahead`` batches beyond the one training next."""

    def __init__(self, mode: TrainerMode) -> None:
        self.threshold, self.strategy = mode.max_off_policy_threshold, mode.max_off_policy_strategy
        depth = mode.lookahead
        if self.threshold is not None and self.strategy == "wait":  # never ask so far ahead that it gets too old
            depth = min(depth, self.threshold - 1)
        self.depth = depth
        self.queue: deque[Generation] = deque()

    def wanted(self) -> int:
        """How many batches to ask for now: enough that the next to train and ``depth`` more are under way."""
        return max(0, self.depth + 1 - len(self.queue))

    def add(self, generation: Generation) -> None:
        self.queue.append(generation)

    def take(self, step: int) -> tuple[Generation | None, list[Generation]]:
        """(the oldest batch ``step`` may train on, or None when every queued batch was evicted; the evicted ones).
        Under ``drop`` a batch past the threshold is evicted; the caller asks for replacements (``wanted``)."""
        evicted = []
        while self.queue:
            oldest = self.queue.popleft()
            if self.strategy == "drop" and self.threshold is not None and oldest.span(step) > self.threshold:
                evicted.append(oldest)
                continue
            return oldest, evicted
        return None, evicted

    def __len__(self) -> int:
        return len(self.queue)


def staleness_metrics(step: int, versions: np.ndarray, first: np.ndarray | None = None) -> dict[str, float]:
    """The off-policy metrics of the samples ``step`` trains on, from the last and first version of the weights
    that generated each one (``versions``, ``first``: (N,) ints; one version when ``first`` is None).
    staleness = (step - 1) - last: 0 when the weights of the step before generated it (on-policy); the worst
    staleness counts from the first, and the span is the versions from first to last."""
    last = versions.astype(np.int64)
    first = last if first is None else first.astype(np.int64)
    metrics = {}
    for name, values in (("trajectory_spans", last - first + 1), ("trajectory_staleness", (step - 1) - last),
                         ("trajectory_staleness_worst", (step - 1) - first)):  # fmt: skip
        metrics.update(_stats(f"{OFF_POLICY}/{name}", values))
    return metrics


def eviction_metrics(step: int, evicted: list[Generation], prompts_each: int) -> dict[str, float]:
    """The eviction metrics: the prompt groups dropped for staleness, and their spans (empty when none were)."""
    if not evicted:
        return {}
    return eviction_stats(np.array([g.span(step) for g in evicted for _ in range(prompts_each)]))


def eviction_stats(spans: np.ndarray) -> dict[str, float]:
    """The eviction metrics of evicted prompt groups with these spans (N,)."""
    return {f"{OFF_POLICY}/evicted_samples": float(len(spans)),
            **_stats(f"{OFF_POLICY}/evicted_samples_staleness", spans)}  # fmt: skip


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
    return {f"{prefix}/mean": float(values.mean()), f"{prefix}/max": float(values.max()),
            f"{prefix}/min": float(values.min())}  # fmt: skip
