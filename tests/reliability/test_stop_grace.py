"""A run stopped while its step cannot finish: SIGTERM then ``trainer.stop_grace_s``, and a second Ctrl-C.

The driver's main thread is stuck in C code (a mutex locked twice: no Python signal handler runs there) in a
process of its own, first bare (``StopSignals`` alone: seconds), then in a real run of ``main.py`` whose
in-process worker is stuck in ``update_actor`` (``stuck_run.py``), and on Ray with a worker hung and the whole
process group signalled (``fault_run.py``)."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.reliability.conftest import REPO, child_env, run_child, tiny_overrides
from tests.reliability.test_preemption import logged_steps
from trainer.running.preemption import EXIT_PREEMPTED, EXIT_SECOND_INTERRUPT
from trainer.state.checkpoint import check_checkpoint

GRACE = 4.0  # trainer.stop_grace_s of these runs: the last 2 s of it are for exiting
SLACK_S = 0.5  # the test's polling (0.3 s) and the process's own exit
STUCK_RUN = str(REPO / "tests" / "reliability" / "stuck_run.py")
FAULT_RUN = str(REPO / "tests" / "reliability" / "fault_run.py")

STUCK = """
import ctypes, sys
from pathlib import Path
from trainer.running.preemption import Ending, StopSignals

grace = float(sys.argv[1]) if sys.argv[1] != "none" else None
ending = Ending(lambda: Path("/run/global_step_1"), lambda why: "colorl: run ended: " + why, lambda: None)
StopSignals(grace, ending).install()
libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(64)
libc.pthread_mutex_lock(mutex)
print("stuck", flush=True)
libc.pthread_mutex_lock(mutex)  # never returns, whatever the signal
"""


@contextlib.contextmanager
def stuck_process(grace: str) -> Iterator[subprocess.Popen]:
    """A process stuck in C under ``StopSignals(grace)``, killed after the block if it is still there."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK, grace], env=child_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout.readline() == "stuck\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_sigterm_abandons_a_step_stuck_in_c_within_the_grace_period():
    with stuck_process(str(GRACE)) as proc:
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == EXIT_PREEMPTED, err
    assert time.monotonic() - sent < GRACE + SLACK_S
    assert out.startswith("colorl: run ended: the step in progress was abandoned, not done 2 s after SIGTERM")
    assert err.splitlines()[-1] == (
        "colorl: stopped by SIGTERM: the step in progress was abandoned, not done 2 s after SIGTERM "
        "(trainer.stop_grace_s=4, less 2 s to exit); the last checkpoint is /run/global_step_1. Rerun the same "
        "command (trainer.resume_mode=auto) to continue from it"
    )


def test_a_second_ctrl_c_stops_at_once_in_one_line_with_status_130():
    with stuck_process("none") as proc:  # no grace period: only the second Ctrl-C ends it
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)  # two presses, not one
        assert proc.poll() is None
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == EXIT_SECOND_INTERRUPT, err
    assert time.monotonic() - sent < 3.0
    assert err.splitlines() == [
        "colorl: received SIGINT: finishing the current step, then saving a checkpoint and exiting (Ctrl-C again to "
        "stop at once)",
        "colorl: stopped at once by a second Ctrl-C; the last checkpoint is /run/global_step_1. Rerun the same "
        "command (trainer.resume_mode=auto) to continue from it",
    ]


def signal_when(path: Path, signals: list[signal.Signals], sent: list[float]) -> None:
    """In a thread: once ``path`` exists, send each of ``signals`` (half a second apart) to the child ``main.py``
    (its process group, as a shell's Ctrl-C or Slurm's scancel does), recording when each went."""

    def watch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not path.exists():
            time.sleep(0.1)
        child = next(c for c in psutil.Process().children() if any(".py" in arg for arg in c.cmdline()[1:2]))
        for sig in signals:
            sent.append(time.monotonic())
            os.killpg(os.getpgid(child.pid), sig)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()


def in_process_overrides(tmp_path: Path, assets: Path, grace: str) -> list[str]:
    overrides = [o for o in tiny_overrides(tmp_path, assets, 3) if not o.startswith("trainer.n_gpus_per_node")]
    return [*overrides, "trainer.n_gpus_per_node=1", "trainer.use_ray=false", f"trainer.stop_grace_s={grace}"]


def check_abandoned(first, sent: float, exited: float, run_dir: Path) -> None:
    """Exit 4 within the grace period, the last word and line naming step 1's checkpoint, intact, and alone."""
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]
    assert exited - sent < GRACE + SLACK_S, exited - sent
    checkpoint = run_dir / "global_step_1"
    assert "Traceback" not in first.stderr
    assert first.stderr.splitlines()[-1].startswith("colorl: stopped by SIGTERM: the step in progress was abandoned")
    assert f"the last checkpoint is {checkpoint}. Rerun the same command" in first.stderr.splitlines()[-1]
    word = first.stdout[first.stdout.index("colorl: run ended: ") :]
    assert word.startswith("colorl: run ended: the step in progress was abandoned, not done 2 s after SIGTERM")
    assert "  steps: 1 of 3 done in " in word and f"  checkpoint: {checkpoint.resolve()}\n" in word
    assert [p.name for p in run_dir.glob("global_step_*")] == ["global_step_1"] and logged_steps(run_dir) == [1]
    check_checkpoint(checkpoint)
    assert first.survivors() == []


def check_resumes(args: list[str], run_dir: Path) -> None:
    """The same command (without the planted hang) continues from step 1 and trains every step once."""
    second = run_child([str(REPO / "main.py"), *args], cwd=run_dir)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resumed from {run_dir / 'global_step_1'} (step 1)" in second.stdout
    assert logged_steps(run_dir) == [1, 2, 3]


@pytest.mark.slow  # two child runs of main.py, ~30 s on 2 cores; the bare StopSignals tests above hold the mechanism
def test_sigterm_while_the_in_process_worker_is_stuck_exits_within_the_grace_period_and_resumes(tmp_path, assets):
    args, sent = in_process_overrides(tmp_path, assets, f"{GRACE:g}"), []
    signal_when(tmp_path / "stuck", [signal.SIGTERM], sent)
    first = run_child([STUCK_RUN, "2", *args], cwd=tmp_path, timeout_s=120)
    check_abandoned(first, sent[0], time.monotonic(), tmp_path)
    check_resumes(args, tmp_path)


@pytest.mark.slow  # a child run of main.py, ~15 s
def test_a_second_ctrl_c_to_a_stuck_real_run_is_one_line_and_status_130(tmp_path, assets):
    args, sent = in_process_overrides(tmp_path, assets, "null"), []
    signal_when(tmp_path / "stuck", [signal.SIGINT, signal.SIGINT], sent)
    run = run_child([STUCK_RUN, "2", *args], cwd=tmp_path, timeout_s=120)
    assert run.returncode == EXIT_SECOND_INTERRUPT, run.stderr[-3000:]
    assert time.monotonic() - sent[1] < 3.0 + SLACK_S
    lines = [line for line in run.stderr.splitlines() if line.startswith("colorl: ")]
    assert lines[-1] == (
        f"colorl: stopped at once by a second Ctrl-C; the last checkpoint is {tmp_path / 'global_step_1'}. Rerun "
        "the same command (trainer.resume_mode=auto) to continue from it"
    )
    assert len(lines) == 2 and "Traceback" not in run.stderr
    check_checkpoint(tmp_path / "global_step_1")
    assert run.survivors() == []


@pytest.mark.slow  # two Ray runs, about a minute
def test_sigterm_to_the_group_of_a_ray_run_with_a_hung_worker_exits_within_the_grace_period_and_resumes(
    tmp_path, assets
):
    """The Ray processes ignore the group's SIGTERM (signals_left_to_driver); the driver abandons the step, kills
    the hung group and the cluster it started within the grace period."""
    args, sent = [*tiny_overrides(tmp_path, assets, 3), f"trainer.stop_grace_s={GRACE:g}"], []
    signal_when(tmp_path / "global_step_1" / "COMPLETE", [signal.SIGTERM], sent)  # step 2 under way
    first = run_child([FAULT_RUN, "hang", "1", "2", *args], cwd=tmp_path, timeout_s=180)
    check_abandoned(first, sent[0], time.monotonic(), tmp_path)
    check_resumes(args, tmp_path)
