"""Running ColoRL in a child process and checking that nothing it started outlives it."""

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]


def tiny_overrides(run_dir: Path, assets: Path, steps: int = 2) -> list[str]:
    """The e2e tests' tiny GRPO run (2 CPU workers), as command-line overrides; a checkpoint every step."""
    return [
        f"builtin.cache_dir={assets}",
        "builtin.hidden_size=32",
        "builtin.num_train=64",
        "builtin.num_val=6",
        "builtin.sft_warmup_steps=2",
        "data.train_batch_size=4",
        "data.max_response_length=6",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "algorithm.adv_estimator=grpo",
        "trainer.n_gpus_per_node=2",
        "trainer.device=cpu",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=1",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run_dir}",
    ]


def child_env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)  # the child starts its own cluster
    return env


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    descendants: set = field(default_factory=set)  # (pid, create_time) of every process seen under the child

    def survivors(self, grace_s: float = 20.0) -> list[str]:
        """Descendants still alive ``grace_s`` after the child exited (Ray reaps its processes asynchronously)."""
        deadline = time.monotonic() + grace_s
        while True:
            alive = []
            for pid, created in self.descendants:
                try:
                    proc = psutil.Process(pid)
                    if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                        alive.append(f"{pid} {' '.join(proc.cmdline())[:80]}")
                except psutil.NoSuchProcess:
                    pass
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.5)


def run_child(args: list[str], cwd: Path, timeout_s: float = 300.0, env: dict[str, str] | None = None) -> Run:
    """Run ``python *args`` in ``cwd`` (``env`` added to ``child_env()``), recording its process tree as it runs.

    The child leads a process group of its own, as a command started from a shell or by Slurm does, so a test can
    signal the whole group without signalling itself."""
    start = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        env={**child_env(), **(env or {})},
        text=True,
        stdout=open(cwd / "stdout.txt", "w"),
        stderr=open(cwd / "stderr.txt", "w"),
        process_group=0,
    )
    seen: set = set()
    parent = psutil.Process(child.pid)
    while child.poll() is None:
        if time.monotonic() - start > timeout_s:
            for proc in [*parent.children(recursive=True), parent]:
                proc.kill()
            pytest.fail(f"child ran past {timeout_s}s:\n{(cwd / 'stderr.txt').read_text()[-3000:]}")
        try:
            seen |= {(p.pid, p.create_time()) for p in parent.children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.3)
    return Run(
        child.returncode,
        (cwd / "stdout.txt").read_text(),
        (cwd / "stderr.txt").read_text(),
        time.monotonic() - start,
        seen,
    )


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``2M``) mounted at ``path`` (made here) for the block: a small disk to fill up, or a
    store to overflow. Skips the test where mounting needs a root it does not have."""
    path.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    ).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture(scope="session")
def assets(tmp_path_factory) -> Path:
    """One cache of the built-in demo assets for every child run of the session."""
    return tmp_path_factory.mktemp("assets")
