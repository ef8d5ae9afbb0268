"""The driver's NaN/inf guard: skipped steps are counted, k in a row abort (pure driver logic, no workers)."""

from types import SimpleNamespace

import pytest

from trainer.checkpoint import CheckpointManager
from trainer.ppo_trainer import NonFiniteLossError, RayPPOTrainer


def driver(tmp_path, limit: int) -> SimpleNamespace:
    return SimpleNamespace(
        nonfinite_total=0,
        nonfinite_streak=0,
        global_step=0,
        checkpoints=CheckpointManager(str(tmp_path)),
        config=SimpleNamespace(trainer=SimpleNamespace(max_nonfinite_steps=limit)),
    )


def test_nonfinite_steps_are_counted_and_abort_after_k_in_a_row(tmp_path):
    state = driver(tmp_path, limit=3)
    sequence = [
        {"actor/pg_loss": 0.1},
        {"actor/pg_loss": float("nan")},
        {"actor/nonfinite_skipped": 1.0},
        {"actor/pg_loss": 0.2},
        {"critic/vf_loss": float("inf")},
        {"actor/nonfinite_skipped": 0.5},
    ]
    for step, metrics in enumerate(sequence, 1):
        state.global_step = step
        RayPPOTrainer._check_finite(state, metrics)
    assert sequence[-1]["training/nonfinite_steps"] == 4 and state.nonfinite_streak == 2
    state.global_step = 7
    with pytest.raises(NonFiniteLossError, match=r"3 steps in a row \(up to step 7\).*intact: none yet"):
        RayPPOTrainer._check_finite(state, {"actor/pg_loss": float("nan")})
