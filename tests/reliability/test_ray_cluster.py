"""``ray_init.address``: a training run joins a cluster started with ``ray start --head`` instead of starting one.

The test starts its own head (a free port, its own temp dir, so ``ray.init()`` elsewhere on this machine never
finds it) with ``--block``, so that ending that one process stops every process of that cluster and no other.
"""

import importlib.util
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import ray

from tests.reliability.conftest import REPO, Run, child_env, run_child, tiny_overrides

RAY = str(Path(sys.executable).parent / "ray")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def head():
    """(address, temp dir) of a one-node cluster with 3 CPUs; stopped and checked for leftovers afterwards."""
    port = free_port()
    temp_dir = Path(tempfile.mkdtemp(prefix="colorl-ray-", dir="/tmp"))  # short: Ray's socket paths are limited
    env = {**child_env(), "RAY_AUTH_MODE": "token"}
    proc = subprocess.Popen(
        [
            RAY,
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=3",
            "--include-dashboard=false",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
            "--block",
        ],
        env=env,
        stdout=open(temp_dir / "head.log", "w"),
        stderr=subprocess.STDOUT,
    )
    tree = Run(0, "", "", 0.0)
    try:
        deadline = time.monotonic() + 60
        while not (temp_dir / "ray_current_cluster").exists():  # written once the head is up
            assert proc.poll() is None and time.monotonic() < deadline, (temp_dir / "head.log").read_text()
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", temp_dir
    finally:
        tree.descendants = {(p.pid, p.create_time()) for p in psutil.Process(proc.pid).children(recursive=True)}
        proc.terminate()  # `ray start --block` stops its cluster's processes on SIGTERM
        proc.wait(60)
        assert tree.survivors() == []
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow  # a second Ray cluster and a training step: ~28 s
def test_one_step_runs_on_the_given_cluster(head, tmp_path, assets):
    address, temp_dir = head
    overrides = [*tiny_overrides(tmp_path, assets, steps=1), "trainer.save_freq=-1", f"ray_init.address={address}"]
    # a cluster from `ray start` checks the token in ~/.ray/auth_token, and so must a driver that joins it
    run = run_child([str(REPO / "main.py"), *overrides], cwd=tmp_path, env={"RAY_AUTH_MODE": "token"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Connecting to existing Ray cluster" in run.stderr and "Started a local Ray instance" not in run.stderr
    assert (tmp_path / "metrics.jsonl").read_text().count('"step": 1') == 1
    # the workers were that cluster's processes: their logs are in its session, under the run's job
    assert list(temp_dir.glob("session_latest/logs/worker-*-01000000-*.out"))
    assert run.survivors() == []  # the driver started no Ray processes of its own


def test_an_address_where_no_cluster_answers_fails_in_seconds(tmp_path, assets):
    address = f"127.0.0.1:{free_port()}"
    run = run_child(
        [str(REPO / "main.py"), *tiny_overrides(tmp_path, assets), f"ray_init.address={address}"],
        cwd=tmp_path,
        timeout_s=120,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"colorl: config error: ray_kwargs.ray_init.address='{address}': no Ray cluster answers there" in run.stderr


@pytest.mark.slow  # a Ray cluster of its own: ~12 s
def test_a_dashboard_is_started_only_when_asked_for(tmp_path, assets):
    """``ray_init.include_dashboard`` (default false) reaches ``ray.init``; with the minimal ``ray`` ColoRL depends
    on, asking for a dashboard is a config error naming what to install."""
    if importlib.util.find_spec("aiohttp") is not None:
        pytest.skip("ray[default] is installed: this checks the minimal ray")
    run = run_child(
        [str(REPO / "main.py"), *tiny_overrides(tmp_path, assets), "ray_init.include_dashboard=true"],
        cwd=tmp_path,
        timeout_s=120,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        "colorl: config error: ray_kwargs.ray_init.include_dashboard=True: Ray's dashboard needs ray[default]: "
        f"pip install 'ray[default]=={ray.__version__}'"
    )
