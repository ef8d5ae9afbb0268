"""Run health: each warning fires once, after its pattern held ``patience`` steps, from crafted metric sequences."""

import math
import random

import pytest
import torch

from config.schema import HealthConfig
from trainer.observing.health import HealthMonitor, trend
from trainer.observing.metrics import reward_group_metrics

VAL = "val-core/colorl/arith/reward/mean@1"
FLEXIBLE = "val-aux/colorl/arith/flexible/mean@1"


def _run(
    steps: list[dict[str, float]], capsys, first_step: int = 1, **config
) -> tuple[list[dict[str, float]], list[str]]:
    monitor = HealthMonitor(HealthConfig(**config), max_response_length=64)
    out = [monitor.observe(metrics, step) for step, metrics in enumerate(steps, start=first_step)]
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("colorl: warning")]
    return out, warnings


def _flags(out: list[dict[str, float]], name: str) -> list[float]:
    return [m.get(f"health/warning/{name}") for m in out]


def test_entropy_collapse_warns_once_after_patience_steps(capsys):
    entropies = [1.0, 0.9, 0.5, 0.08, 0.05, 0.04, 0.03, 0.02, 0.01]  # below 0.1 × 1.0 from the fourth step on
    out, warnings = _run([{"actor/entropy": e} for e in entropies], capsys, patience=3)
    assert _flags(out, "entropy_collapse") == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert len(warnings) == 1
    assert "step 6: the policy's entropy has collapsed" in warnings[0] and "entropy_collapse_ratio" in warnings[0]


def test_a_pattern_that_stops_resets_its_streak(capsys):
    entropies = [1.0, 0.05, 0.05, 0.5, 0.05, 0.05]  # two low, a recovery, two low: never three in a row
    out, warnings = _run([{"actor/entropy": e} for e in entropies], capsys, patience=3)
    assert not any(_flags(out, "entropy_collapse")) and not warnings


def test_responses_at_the_limit(capsys):
    clip = [0.1, 0.6, 0.7, 0.9, 0.2, 0.8]
    out, warnings = _run([{"response_length/clip_ratio": c} for c in clip], capsys, patience=3, max_clip_ratio=0.5)
    assert _flags(out, "responses_at_limit") == [0, 0, 0, 1, 0, 0]
    assert len(warnings) == 1 and "cut at data.max_response_length=64" in warnings[0]


def test_all_equal_groups(capsys):
    shares = [0.5, 0.95, 0.97, 1.0, 1.0]
    out, warnings = _run(
        [{"health/frac_reward_zero_std": s} for s in shares], capsys, patience=2, max_all_equal_share=0.9
    )
    assert _flags(out, "all_equal_groups") == [0, 0, 1, 1, 1]
    assert len(warnings) == 1 and "no signal" in warnings[0] and "rollout.n" in warnings[0]


def test_reward_rising_while_a_held_out_score_falls(capsys):
    """Validations before training and every 2 steps: the training score climbs throughout; the flexible held-out
    score rises to step 4, then falls at steps 6 and 8: two validations in a row. The first comparison needs two
    in-training validations (a training score before and after)."""
    steps = []
    for step in range(1, 9):
        metrics = {"critic/score/mean": step / 10}
        if step % 2 == 0:
            metrics |= {VAL: 0.5, FLEXIBLE: {2: 0.6, 4: 0.7, 6: 0.5, 8: 0.4}[step]}
        steps.append(metrics)
    out, warnings = _run([{VAL: 0.5, FLEXIBLE: 0.55}, *steps], capsys, first_step=0, divergence_validations=2)
    assert _flags(out, "reward_vs_held_out") == [None, None, None, None, 0, None, 0, None, 1]
    assert len(warnings) == 1 and "step 8:" in warnings[0]
    assert FLEXIBLE in warnings[0] and "(0.5 → 0.4)" in warnings[0]


def test_held_out_and_training_score_rising_together_is_healthy(capsys):
    steps = [{"critic/score/mean": step / 10} | ({VAL: step / 10} if step % 2 == 0 else {}) for step in range(1, 11)]
    out, warnings = _run(steps, capsys, divergence_validations=1)
    assert not any(_flags(out, "reward_vs_held_out")) and not warnings


def test_response_length_trend_is_the_slope_over_the_window(capsys):
    out, _ = _run([{"response_length/mean": 10 + 2 * s} for s in range(8)], capsys, patience=4)
    assert out[-1]["health/response_length_trend"] == pytest.approx(2.0)
    assert trend([3.0]) == 0.0 and trend([1.0, 1.0, 1.0]) == 0.0


def test_share_of_groups_with_all_equal_rewards():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5])  # groups a: equal, b: mixed, c: equal, d: equal
    uids = ["a", "a", "b", "b", "c", "c", "d", "d"]
    assert reward_group_metrics(scores, uids) == {"health/frac_reward_zero_std": 0.75}
    assert reward_group_metrics(torch.tensor([1.0, 0.0]), ["a", "b"]) == {}  # n = 1: no groups to judge


def test_a_non_finite_value_neither_counts_nor_resets(capsys):
    entropies = [float("nan"), 1.0, 0.05, float("nan"), 0.05, 0.05]  # the first finite value is the reference
    out, warnings = _run([{"actor/entropy": e} for e in entropies], capsys, patience=3)
    assert _flags(out, "entropy_collapse") == [None, 0, 0, None, 0, 1] and len(warnings) == 1


def test_a_large_gap_between_sampler_and_learner_warns_at_once(capsys):
    gaps = [1e-6, 2e-3, 0.2, 0.3, 1e-6]  # the rollout's probabilities of its samples against the actor's
    out, warnings = _run([{"training/rollout_probs_diff_mean": g} for g in gaps], capsys, patience=3)
    assert _flags(out, "rollout_mismatch") == [0, 0, 1, 1, 0]
    assert len(warnings) == 1 and "step 3: the rollout's token probabilities differ" in warnings[0]
    assert "trainer.health.max_rollout_probs_diff" in warnings[0]


def test_rollout_probs_diff_is_verls_debug_metric():
    """training/rollout_probs_diff_* and the Pearson correlation: verl 0.9.1's numbers on the same batch."""
    from verl import DataProto as VerlDataProto
    from verl.utils.debug.metrics import calculate_debug_metrics

    from trainer.observing.metrics import rollout_probs_diff

    g = torch.Generator().manual_seed(0)
    actor = -torch.rand(6, 5, generator=g) * 3
    batch = {
        "old_log_probs": actor,
        "rollout_log_probs": actor + torch.randn(6, 5, generator=g) * 0.1,
        "response_mask": (torch.rand(6, 5, generator=g) > 0.3).long(),
        "responses": torch.zeros(6, 5, dtype=torch.long),
    }
    ours = rollout_probs_diff(batch)
    theirs = calculate_debug_metrics(VerlDataProto.from_dict(dict(batch)))
    assert ours == pytest.approx({k: float(v) for k, v in theirs.items()}, rel=1e-5)
    same = rollout_probs_diff({**batch, "rollout_log_probs": actor})  # the rollout is the actor: no gap
    assert same["training/rollout_probs_diff_max"] == 0.0


# ---- runs as a whole: each warning fires on the run it describes, and none on a healthy one ----------------------


def demo_shaped_run(seed: int, steps: int = 700) -> list[dict[str, float]]:
    """Metrics shaped like the default demo's (``make run``: GRPO, 16 prompts × 8, validation every 20 steps): the
    training score climbs from 0.05 along a logistic curve to about 0.92 (step noise 0.05, now and then a dip), the
    entropy decays from 3 to 2 % of it (below 0.1 × its first value from about step 420, while the score still
    climbs), responses are cut at the limit at first, and groups with all-equal rewards grow as most answers
    become right. Greedy validation sits above the training score, with its own noise."""
    rng = random.Random(seed)
    out = [{VAL: 0.12 + rng.gauss(0, 0.02)}]  # validation before training, at step 0
    for t in range(1, steps + 1):
        level = 0.05 + 0.87 / (1 + math.exp(-(t - 400) / 60))
        score = min(1.0, max(0.0, level + rng.gauss(0, 0.05) - (0.2 if rng.random() < 0.03 else 0.0)))
        metrics = {
            "critic/score/mean": score,
            "critic/score/max": 1.0,
            "critic/score/min": 0.0,
            "actor/entropy": 3.0 * math.exp(-t / 180) * (1 + rng.gauss(0, 0.05)),
            "response_length/clip_ratio": max(0.0, 0.55 * math.exp(-t / 20) + rng.gauss(0, 0.05)),
            "response_length/mean": 5 + rng.gauss(0, 0.3),
            "health/frac_reward_zero_std": min(1.0, max(0.0, 1.9 * (level - 0.5) + rng.gauss(0, 0.12))),
        }
        if t % 20 == 0:
            metrics[VAL] = min(1.0, level + 0.08 + rng.gauss(0, 0.04))
        out.append(metrics)
    return out


def _warnings_of(run: list[dict[str, float]], **config) -> dict[str, tuple[int, str]]:
    monitor = HealthMonitor(HealthConfig(**config), max_response_length=8)
    for step, metrics in enumerate(run):
        monitor.observe(metrics, step)
    return monitor.fired


@pytest.mark.parametrize("seed", range(5))
def test_the_demos_healthy_run_warns_of_nothing(seed, capsys):
    run = demo_shaped_run(seed)
    entropies = [m["actor/entropy"] for m in run[1:]]
    collapsed = next(t for t, e in enumerate(entropies, start=1) if e < 0.1 * entropies[0])
    assert run[collapsed]["critic/score/mean"] < 0.8  # the entropy is low well before the score stops climbing
    assert _warnings_of(run) == {}
    assert "warning" not in capsys.readouterr().err


def stalled_run(steps: int, **overrides: float) -> list[dict[str, float]]:
    """A run whose training score sits at 0.3 (noise 0.03) from the start, with ``overrides`` (metric ->
    value) on every step, and the demo's other metrics healthy."""
    rng = random.Random(0)
    return [
        {
            "critic/score/mean": 0.3 + rng.gauss(0, 0.03),
            "critic/score/max": 1.0,
            "critic/score/min": 0.0,
            "actor/entropy": 3.0 * math.exp(-t / 20),  # collapsed (below 0.3) from step 47
            "response_length/clip_ratio": 0.05,
            "health/frac_reward_zero_std": 0.2,
            **overrides,
        }
        for t in range(steps)
    ]


def climbing_run(steps: int, **overrides: float) -> list[dict[str, float]]:
    """``stalled_run`` with the score climbing from 0.1 to 0.7 instead."""
    return [m | {"critic/score/mean": 0.1 + 0.6 * t / steps} for t, m in enumerate(stalled_run(steps, **overrides))]


def test_entropy_collapse_while_the_score_stalls_warns_and_while_it_climbs_does_not():
    fired = _warnings_of(stalled_run(160))
    assert set(fired) == {"entropy_collapse"} and fired["entropy_collapse"][0] == 108  # 10 steps from the full window
    assert "stalled" in fired["entropy_collapse"][1] and "stall_window" in fired["entropy_collapse"][1]
    assert _warnings_of(climbing_run(160)) == {}


def test_a_converged_run_is_not_a_collapse():
    """Low entropy and a flat score near the best response's: the policy has learnt the task."""
    assert _warnings_of(stalled_run(160, **{"critic/score/mean": 0.93})) == {}
    assert "entropy_collapse" in _warnings_of(stalled_run(160, **{"critic/score/mean": 0.75}))  # below 0.8 of it


def test_responses_at_the_limit_while_the_score_stalls():
    fired = _warnings_of(stalled_run(160, **{"actor/entropy": 3.0, "response_length/clip_ratio": 0.8}))
    assert (
        set(fired) == {"responses_at_limit"} and "cut at data.max_response_length=8" in fired["responses_at_limit"][1]
    )
    assert _warnings_of(climbing_run(160, **{"actor/entropy": 3.0, "response_length/clip_ratio": 0.8})) == {}


def test_all_equal_groups_of_prompts_too_hard_warn_and_of_a_converged_policy_do_not():
    hard = {"actor/entropy": 3.0, "health/frac_reward_zero_std": 0.95, "critic/score/mean": 0.02}
    fired = _warnings_of(stalled_run(160, **hard))
    assert set(fired) == {"all_equal_groups"} and "no signal" in fired["all_equal_groups"][1]
    assert _warnings_of(stalled_run(160, **(hard | {"critic/score/mean": 0.97}))) == {}


def test_every_response_scoring_the_same_is_a_stall():
    same = {"actor/entropy": 3.0, "health/frac_reward_zero_std": 1.0, "critic/score/mean": 1.0}
    fired = _warnings_of(stalled_run(120, **(same | {"critic/score/max": 1.0, "critic/score/min": 1.0})))
    assert set(fired) == {"all_equal_groups"}


def test_the_training_score_rising_while_held_out_falls_warns_but_noise_does_not():
    """Reward hacking: the training score climbs every interval while the held-out score falls validation after
    validation. The demo's false alarm was two noisy validation drops while the training score stood still."""

    def run(train, held_out):  # step noise ±0.05, validation every 20 steps
        out = [{VAL: held_out(0)}]
        for t in range(1, 121):
            out.append({"critic/score/mean": train(t) + 0.05 * (-1) ** t} | ({VAL: held_out(t)} if t % 20 == 0 else {}))
        return out

    fired = _warnings_of(run(lambda t: 0.2 + t / 200, lambda t: 0.6 if t <= 40 else 0.6 - t / 400))
    assert set(fired) == {"reward_vs_held_out"} and fired["reward_vs_held_out"][0] == 80
    # the training score gains 0.01 an interval, well inside its noise; validation bounces as the demo's did
    noisy_validation = {0: 0.5, 20: 0.55, 40: 0.62, 60: 0.566, 80: 0.495, 100: 0.624, 120: 0.615}
    assert _warnings_of(run(lambda t: 0.45 + t / 2000, noisy_validation.get)) == {}
