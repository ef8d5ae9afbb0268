"""The driver's NaN/inf guard: skipped steps are counted, k in a row abort (pure driver logic, no workers)."""

import pytest

from trainer.observing.health import NonFiniteGuard, NonFiniteLossError


def test_nonfinite_steps_are_counted_and_abort_after_k_in_a_row():
    guard = NonFiniteGuard(limit=3)
    sequence = [
        {"actor/pg_loss": 0.1},
        {"actor/pg_loss": float("nan")},
        {"actor/nonfinite_skipped": 1.0},
        {"actor/pg_loss": 0.2},
        {"critic/vf_loss": float("inf")},
        {"actor/nonfinite_skipped": 0.5},
    ]
    for step, metrics in enumerate(sequence, 1):
        guard.check(metrics, step, None)
    assert sequence[-1]["training/nonfinite_steps"] == 4 and guard.streak == 2
    with pytest.raises(NonFiniteLossError, match=r"3 steps in a row \(up to step 7\).*intact: none yet"):
        guard.check({"actor/pg_loss": float("nan")}, 7, None)
