"""SIGTERM or SIGINT to the whole process group of a real run of ``main.py`` (a child process), as Slurm's
``scancel``, ``systemd stop`` or Ctrl-C in a terminal send it; then the same command again."""

import json
import os
import signal
import threading
import time

import psutil
import pytest

from tests.reliability.conftest import REPO, run_child, tiny_overrides
from trainer.running.preemption import EXIT_PREEMPTED
from trainer.state.checkpoint import check_checkpoint

STEPS = 12  # tiny steps are fast: room for the signal to land well before the last one


def logged_steps(run_dir) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def signal_group_when_logged(run_dir, step: int, sig: signal.Signals) -> threading.Thread:
    """Send ``sig`` to the process group of the child ``main.py`` (it, its local Ray cluster and the workers that
    cluster started) once ``step`` is in its metrics.jsonl: a step is in progress then."""

    def watch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if step in logged_steps(run_dir):
                for child in psutil.Process().children():
                    if any(arg.endswith("main.py") for arg in child.cmdline()):
                        os.killpg(os.getpgid(child.pid), sig)
                        return
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def preempted_run(tmp_path, assets, sig: signal.Signals, more: tuple[str, ...] = ()) -> tuple[list[str], int]:
    """A run stopped by ``sig`` to its group: (its arguments, the step it stopped after), checked on the way."""
    # periodic checkpoints off: the one written on the signal is the only one to resume from
    overrides = [o for o in tiny_overrides(tmp_path, assets, STEPS) if not o.startswith("trainer.save_freq")]
    overrides += more
    args = [str(REPO / "main.py"), *overrides, "trainer.save_freq=-1"]
    signal_group_when_logged(tmp_path, 2, sig)
    first = run_child(args, cwd=tmp_path)
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]
    stopped_at = logged_steps(tmp_path)[-1]
    assert 2 <= stopped_at < STEPS and logged_steps(tmp_path) == list(range(1, stopped_at + 1))
    assert f"colorl: received {sig.name}: finishing the current step" in first.stderr
    assert f"colorl: stopped by {sig.name} after step {stopped_at}; its checkpoint is " in first.stderr
    assert "Traceback" not in first.stderr
    # the run's last word says why it ended and where its checkpoint is; nothing sub-second or from Ray on the way
    word = first.stdout[first.stdout.index("colorl: run ended: ") :]
    assert word.startswith("colorl: run ended: preempted (a stop signal)")
    assert f"  checkpoint: {(tmp_path / f'global_step_{stopped_at}').resolve()}\n" in word
    assert "Loading weights" not in first.stdout + first.stderr and "Token authentication" not in first.stderr
    assert [p.name for p in tmp_path.glob("global_step_*")] == [f"global_step_{stopped_at}"]
    check_checkpoint(tmp_path / f"global_step_{stopped_at}")
    assert first.survivors() == []
    return args, stopped_at


@pytest.mark.slow  # a minute of Ray runs: make test keeps under its 20 minutes
def test_sigterm_to_the_group_checkpoints_the_step_and_the_same_command_continues_from_it(tmp_path, assets):
    args, stopped_at = preempted_run(tmp_path, assets, signal.SIGTERM)
    second = run_child(args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resumed from {tmp_path / f'global_step_{stopped_at}'} (step {stopped_at})" in second.stdout
    assert logged_steps(tmp_path) == list(range(1, STEPS + 1))  # every step once: none lost, none repeated


# ~85 s, two separate_async child runs (SIGTERM: the test above; the batch in flight: tests/e2e/test_async_e2e.py)
@pytest.mark.slow
def test_sigterm_in_separate_async_saves_the_batch_in_flight_and_the_same_command_continues(tmp_path, assets):
    """trainer.v1.trainer_mode=separate_async (1 + 1 workers): the signal's checkpoint holds the batch generated
    ahead; the second run trains on it and completes every step once."""
    separate = ("trainer.n_gpus_per_node=1", "trainer.v1.trainer_mode=separate_async")
    separate += ("trainer.v1.separate_async.parameter_sync_step=1", "actor_rollout_ref.rollout.nnodes=1")
    separate += ("actor_rollout_ref.rollout.n_gpus_per_node=1",)
    args, stopped_at = preempted_run(tmp_path, assets, signal.SIGTERM, separate)
    second = run_child(args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert logged_steps(tmp_path) == list(range(1, STEPS + 1))
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    staleness = [r["training/off_policy/trajectory_staleness/max"] for r in records]
    assert staleness == [0] + [1] * (STEPS - 1)  # the batch in flight at the signal kept its version


@pytest.mark.slow  # a third child run: SIGINT takes the same path as SIGTERM
def test_ctrl_c_to_the_group_checkpoints_the_step(tmp_path, assets):
    preempted_run(tmp_path, assets, signal.SIGINT)
