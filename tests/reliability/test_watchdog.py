"""PhaseWatchdog on its own: deadlines per phase, the report, the teardown and the exit status."""

import io
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from trainer.running.watchdog import EXIT_HUNG, PhaseWatchdog

REPO = Path(__file__).resolve().parents[2]


class Exits:
    """An exit_fn that records the status instead of ending the test process."""

    def __init__(self) -> None:
        self.codes: list[int] = []
        self.called = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.called.set()


def make(deadlines=None, default_s=0.3, dump=lambda: "rank 1 is stuck in nap()", teardown=None):
    exits, stream = Exits(), io.StringIO()
    dog = PhaseWatchdog(deadlines or {}, default_s, dump_fn=dump, teardown_fn=teardown, exit_fn=exits, stream=stream)
    return dog, exits, stream


def test_phases_within_their_deadline_do_not_fire():
    dog, exits, _ = make(default_s=0.5)
    for _ in range(3):
        with dog.phase("gen"):
            time.sleep(0.05)
    time.sleep(0.7)  # past the deadline of a phase that has already ended
    assert exits.codes == []


def test_a_stalled_phase_is_reported_torn_down_and_exits():
    torn_down = threading.Event()
    dog, exits, stream = make(deadlines={"update_actor": 0.2}, default_s=30, teardown=torn_down.set)
    with dog.phase("update_actor"):
        assert exits.called.wait(10)
    report = stream.getvalue()
    assert exits.codes == [EXIT_HUNG]
    assert "phase 'update_actor' passed its 0.2 s deadline" in report
    assert "rank 1 is stuck in nap()" in report
    assert "--- driver (main thread) ---" in report and "test_a_stalled_phase_is_reported" in report
    assert "trainer.resume_mode=auto" in report
    assert torn_down.is_set()


def test_nested_phases_keep_their_own_deadlines():
    dog, exits, stream = make(deadlines={"outer": 30, "inner": 0.2})
    with dog.phase("outer"), dog.phase("inner"):
        assert exits.called.wait(10)
    assert "phase 'inner'" in stream.getvalue()


def test_unlisted_phases_are_unwatched_without_a_default():
    dog, exits, stream = make(deadlines={"gen": 0.1}, default_s=None)
    with dog.phase("reward"):  # five times gen's deadline: it would fire if reward were watched at all
        time.sleep(0.5)
    assert exits.codes == []
    with dog.phase("gen"):  # while the listed phase, with the same clock, does fire
        assert exits.called.wait(10)
    assert exits.codes == [EXIT_HUNG] and "phase 'gen'" in stream.getvalue()


def test_a_failing_dump_still_exits():
    def dump() -> str:
        raise RuntimeError("ray is gone")

    dog, exits, stream = make(dump=dump, default_s=0.1)
    with dog.phase("gen"):
        assert exits.called.wait(10)
    assert exits.codes == [EXIT_HUNG] and "RuntimeError: ray is gone" in stream.getvalue()


def test_exit_now_ends_the_process_and_its_children(tmp_path):
    script = (
        "import subprocess, sys\n"
        "from trainer.running.watchdog import exit_now\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print(child.pid, flush=True)\n"
        "exit_now(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 3, done.stderr
    child = int(done.stdout.split()[0])
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_phase_waits_while_its_thread_is_in_the_debugger():
    """A traced main thread (pdb at a breakpoint()) holds the deadline; untraced again, the phase expires."""
    dog, exits, _ = make(default_s=0.2)

    def tracer(frame, event, arg):  # what pdb leaves on the frames it steps through: an f_trace
        return tracer

    def at_the_prompt() -> None:
        time.sleep(1.0)  # five deadlines

    with dog.phase("update_actor"):
        sys.settrace(tracer)
        try:
            at_the_prompt()
        finally:
            sys.settrace(None)
        assert exits.codes == []
        assert exits.called.wait(5)  # the debugger let go: the phase's clock runs again
    assert exits.codes == [EXIT_HUNG]
