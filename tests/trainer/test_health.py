"""Run health: each warning fires once, after its pattern held ``patience`` steps, from crafted metric sequences."""

import pytest
import torch

from config.schema import HealthConfig
from trainer.health import HealthMonitor, trend
from trainer.metrics import reward_group_metrics

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

    from trainer.metrics import rollout_probs_diff

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
