"""Run health: whether training still learns, as metrics every step, and warnings, once and in words, when not.

The driver's metrics carry the signals: ``actor/entropy``, ``response_length/mean`` and
``/clip_ratio``, ``critic/score/mean``, ``actor/kl_loss`` / ``actor/ref_kl``, ``actor/pg_clipfrac``, the validation
scores ``val-core/<source>/reward/mean@n`` and the scores the reward does not train ``val-aux/<source>/<key>/mean@n``
(e.g. the flexible score beside the strict one), and ``health/frac_reward_zero_std`` (``trainer.observing.metrics``).
The monitor adds ``health/response_length_trend`` (tokens per step over the last ``patience`` steps) and one flag per
pattern, ``health/warning/<name>``, 1 on the steps where the pattern has held long enough, so wandb shows when.

Patterns (thresholds in ``trainer.health``): the entropy collapsing to a fraction of its first value, responses
running to ``max_response_length``, prompt groups whose responses all got the same reward (no GRPO signal), the
training score rising while a held-out score falls from one validation to the next (reward hacking), and the
rollout engine's probabilities of its samples far from the actor's (``training/rollout_probs_diff_mean``).

A warning names a run that stopped learning, so the first three count only while the training score has stalled:
over the last ``stall_window`` steps its least-squares trend is not significantly above zero (t < 2) and its mean
over the later half of them stays below ``converged_share`` of the way from the lowest to the highest response
score of those steps. Low
entropy while the score climbs, or once most responses score the best, is what learning looks like. The fourth
needs the training score to rise significantly between validations (Welch's t > 2 on the steps' scores), not
by noise. The fifth fires at once.

``NonFiniteGuard`` stops a run whose updates keep being skipped for NaN/inf losses or gradients.
"""

from __future__ import annotations

import math
import re
import statistics
import sys
from collections import deque
from typing import Any

from planner.worker_roles import ROLES

ENTROPY, CLIP, SCORE, LENGTH = (
    "actor/entropy",
    "response_length/clip_ratio",
    "critic/score/mean",
    "response_length/mean",
)
SCORE_MAX, SCORE_MIN = "critic/score/max", "critic/score/min"
SIGNIFICANT = 2.0  # t statistic above which a rise is more than noise
ZERO_STD = "health/frac_reward_zero_std"
HELD_OUT = re.compile(r"val-(core|aux)/.+/mean@\d+")  # per-source validation means: reward and extra scores
PROBS_DIFF = "training/rollout_probs_diff_mean"
WARNINGS = ("entropy_collapse", "responses_at_limit", "all_equal_groups", "reward_vs_held_out", "rollout_mismatch")


def trend(values: list[float]) -> float:
    """Least-squares slope of ``values`` against their index (units per step); 0 for fewer than two."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x, mean_y = (n - 1) / 2, statistics.fmean(values)
    return sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values)) / sum((i - mean_x) ** 2 for i in range(n))


def rising(values: list[float]) -> bool:
    """Whether ``values`` trend up by more than their noise: the least-squares slope over its standard error
    exceeds ``SIGNIFICANT`` (needs three values)."""
    n = len(values)
    if n < 3:
        return False
    slope, mean_x, mean_y = trend(values), (n - 1) / 2, statistics.fmean(values)
    residual = sum((v - mean_y - slope * (i - mean_x)) ** 2 for i, v in enumerate(values)) / (n - 2)
    spread = sum((i - mean_x) ** 2 for i in range(n))
    return slope > 0 and (residual == 0 or slope / math.sqrt(residual / spread) > SIGNIFICANT)


def significantly_higher(after: list[float], before: list[float]) -> bool:
    """Whether the mean of ``after`` exceeds that of ``before`` by more than noise (Welch's t > ``SIGNIFICANT``;
    two values each at least)."""
    if len(after) < 2 or len(before) < 2:
        return False
    gain = statistics.fmean(after) - statistics.fmean(before)
    error = math.sqrt(statistics.variance(after) / len(after) + statistics.variance(before) / len(before))
    return gain > 0 and (error == 0 or gain / error > SIGNIFICANT)


class HealthMonitor:
    """Watches each step's metrics (``observe``); ``config`` is ``trainer.health``, ``max_response_length``
    ``data.max_response_length``. State lives in the driver for the run (a resumed run starts watching afresh)."""

    def __init__(self, config: Any, max_response_length: int) -> None:
        self.config, self.max_response_length = config, max_response_length
        self.streaks = dict.fromkeys(WARNINGS, 0)
        self.fired: dict[str, tuple[int, str]] = {}  # warning -> (the step it first fired, its message)
        self.lengths: deque[float] = deque(maxlen=config.patience)
        self.first_entropy: float | None = None
        self.window: deque[tuple[float, float, float]] = deque(maxlen=config.stall_window)  # score, max, min
        self.scores: list[float] = []  # training scores since the last validation
        self.previous: tuple[list[float], dict[str, float]] | None = None  # (training scores, held-out) then

    def observe(self, metrics: dict[str, float], step: int) -> dict[str, float]:
        """``metrics`` with this step's health metrics and warning flags added; prints a warning the first time
        its pattern has held long enough."""
        out = dict(metrics)
        metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}  # a NaN step says nothing about health
        if LENGTH in metrics:
            self.lengths.append(metrics[LENGTH])
            out["health/response_length_trend"] = trend(list(self.lengths))
        if SCORE in metrics:
            self.scores.append(metrics[SCORE])
            score = metrics[SCORE]
            self.window.append((score, metrics.get(SCORE_MAX, score), metrics.get(SCORE_MIN, score)))
        stalled = self._stalled()
        messages = {  # None: the signal is not in this step's metrics; "": it is healthy; else what is wrong
            "entropy_collapse": self._entropy(metrics, stalled),
            "responses_at_limit": self._above(CLIP, metrics, self.config.max_clip_ratio, stalled),
            "all_equal_groups": self._above(ZERO_STD, metrics, self.config.max_all_equal_share, stalled),
            "reward_vs_held_out": self._divergence(metrics),
            "rollout_mismatch": self._mismatch(metrics),
        }
        for name, message in messages.items():
            if message is None:  # the streak stands
                continue
            limit = {"reward_vs_held_out": self.config.divergence_validations, "rollout_mismatch": 1}.get(
                name, self.config.patience
            )
            self.streaks[name] = self.streaks[name] + 1 if message else 0
            firing = self.streaks[name] >= limit
            out[f"health/warning/{name}"] = float(firing)
            if firing and name not in self.fired:
                self.fired[name] = (step, message)
                print(f"colorl: warning: step {step}: {message}", file=sys.stderr, flush=True)
        return out

    def _stalled(self) -> str | None:
        """How the training score has stalled (for the messages), or None while it rises, has converged, or the
        window is not full yet. A run that logs no training score: always "" (each pattern judges alone)."""
        if not self.window:
            return ""
        window = self.config.stall_window
        scores = [score for score, _, _ in self.window]
        if len(scores) < window or rising(scores):
            return None
        high = max(max(high for _, high, _ in self.window), max(scores))
        low = min(min(low for _, _, low in self.window), min(scores))
        mean = statistics.fmean(scores[window // 2 :])  # where the score is now, less noisy than one step
        if high > low and (mean - low) / (high - low) >= self.config.converged_share:
            return None
        return (
            f" while the training score has stalled ({SCORE} {mean:.3g}, not rising over the last {window} steps, "
            f"below {self.config.converged_share} of the way from {low:.3g} to the best response's {high:.3g}; "
            "trainer.health.stall_window)"
        )

    def _entropy(self, metrics: dict[str, float], stalled: str | None) -> str | None:
        if ENTROPY not in metrics:
            return None
        entropy = metrics[ENTROPY]
        if self.first_entropy is None:
            self.first_entropy = entropy
        ratio = self.config.entropy_collapse_ratio
        if entropy >= ratio * self.first_entropy or stalled is None:
            return ""
        return (
            f"the policy's entropy has collapsed: actor/entropy {entropy:.3g} has stayed below {ratio} × its "
            f"first value {self.first_entropy:.3g} for {self.config.patience} steps{stalled}, so sampling barely "
            "explores (raise actor_rollout_ref.actor.entropy_coeff or the rollout temperature, or lower the "
            "learning rate; trainer.health.entropy_collapse_ratio sets the threshold)"
        )

    def _above(self, key: str, metrics: dict[str, float], threshold: float, stalled: str | None) -> str | None:
        if key not in metrics:
            return None
        share = metrics[key]
        if share <= threshold or stalled is None:
            return ""
        patience = self.config.patience
        if key == CLIP:
            return (
                f"{share:.0%} of the responses were cut at data.max_response_length={self.max_response_length} "
                f"(response_length/clip_ratio above {threshold}) for {patience} steps{stalled}; a cut answer "
                "usually scores 0 (raise data.max_response_length or reward shorter answers; "
                "trainer.health.max_clip_ratio sets the threshold)"
            )
        return (
            f"{share:.0%} of the prompt groups got the same reward for every response ({key} above {threshold}) "
            f"for {patience} steps{stalled}; such groups give GRPO no signal: the prompts are too easy or too "
            "hard for the policy (raise actor_rollout_ref.rollout.n or change the data's difficulty; "
            "trainer.health.max_all_equal_share sets the threshold)"
        )

    def _mismatch(self, metrics: dict[str, float]) -> str | None:
        """The sampler and the learner disagree on the sampled tokens' probabilities (at once: it is a setup
        problem, not a trend): stale weights, another precision, or an engine's kernels far from the actor's."""
        if PROBS_DIFF not in metrics:
            return None
        gap, threshold = metrics[PROBS_DIFF], self.config.max_rollout_probs_diff
        if gap <= threshold:
            return ""
        return (
            f"the rollout's token probabilities differ from the actor's by {gap:.3g} on average "
            f"({PROBS_DIFF} above {threshold}): the samples are off-policy for the update (check that the rollout "
            "engine computes in the actor's precision (fsdp_config.mixed_precision) and takes its weights; "
            "rollout correction, algorithm.rollout_correction, weights for the gap; "
            "trainer.health.max_rollout_probs_diff sets the threshold)"
        )

    def _divergence(self, metrics: dict[str, float]) -> str | None:
        """At a validation: did the training score rise and a held-out score fall since the previous one?"""
        held_out = {k: v for k, v in metrics.items() if HELD_OUT.fullmatch(k)}
        if not held_out:
            return None
        scores = self.scores
        previous, self.previous, self.scores = self.previous, (scores, held_out), []
        if previous is None or len(scores) < 2 or len(previous[0]) < 2:  # nothing to compare with yet
            return None
        fell = [k for k, v in held_out.items() if k in previous[1] and v < previous[1][k]]
        if not (fell and significantly_higher(scores, previous[0])):
            return ""
        key, before, after = fell[0], statistics.fmean(previous[0]), statistics.fmean(scores)
        return (
            f"the training score rose ({before:.3g} → {after:.3g}) while the held-out {key} fell "
            f"({previous[1][key]:.3g} → {held_out[key]:.3g}) at {self.config.divergence_validations} "
            "validations in a row: the policy may be exploiting the reward or overfitting the training prompts; "
            "read some samples (trainer.health.divergence_validations sets the patience)"
        )


class NonFiniteLossError(RuntimeError):
    """Too many consecutive steps with NaN/inf losses or gradients."""


class NonFiniteGuard:
    """The driver's NaN/inf guard: counts the steps whose updates were skipped for NaN/inf losses or gradients
    (``training/nonfinite_steps``) and stops the run after ``limit`` in a row (``trainer.max_nonfinite_steps``)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.streak, self.total = limit, 0, 0

    def check(self, metrics: dict[str, float], step: int, latest_checkpoint: Any) -> None:
        """Count step ``step``'s ``metrics`` (adding ``training/nonfinite_steps``); ``NonFiniteLossError`` naming
        ``latest_checkpoint`` (intact) when the streak reaches the limit."""
        skipped = any(
            metrics.get(f"{role}/nonfinite_skipped", 0.0) > 0 for role in (r.name for r in ROLES if r.trained)
        )
        skipped = skipped or not all(math.isfinite(v) for k, v in metrics.items() if k.endswith("_loss"))
        self.total += skipped
        self.streak = self.streak + 1 if skipped else 0
        metrics["training/nonfinite_steps"] = float(self.total)
        if self.streak >= self.limit:
            raise NonFiniteLossError(
                f"{self.limit} steps in a row (up to step {step}) had NaN/inf losses or gradients and were "
                f"skipped; stopping. The last checkpoint is intact: {latest_checkpoint or 'none yet'}. "
                "Lower the learning rate or check the reward (trainer.max_nonfinite_steps sets the limit)."
            )
