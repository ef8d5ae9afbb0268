"""Two Ray nodes on this machine: ``trainer.nnodes=2`` puts one worker on each, they rendezvous at rank 0's node
address, train and checkpoint; the run resumes on one node; ``ray job submit`` runs it on the same cluster.

Each node is its own ``ray start --block`` (its own temp dir and ports, one token), so ending those two processes
stops this cluster and nothing else on the machine. Each node has 1 CPU, so Ray cannot put both workers on one
node; the second node has its own IP (127.0.0.2, on loopback), so another node is another node id *and* another
address, and a rank that joined the world reached rank 0 through Ray's node address, not a local one.
"""

import json
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.reliability.conftest import REPO, Run, child_env, run_child, tiny_overrides
from tests.reliability.test_ray_cluster import free_port

pytestmark = pytest.mark.slow  # two nodes started, four child runs: about two minutes on 2 cores

RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` CLI of this interpreter
SECOND_NODE_IP = "127.0.0.2"
PLACED = re.compile(r"rank (\d+) pid \d+ on (\S+) \(node (\w+)\)")


def has_dashboard() -> bool:
    """`ray job` talks to Ray's dashboard, which needs ``ray[default]``, not the minimal ``ray``."""
    try:
        import ray.dashboard.optional_deps  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class Cluster:
    address: str  # GCS, for ray_init.address
    dashboard: str | None  # http address for `ray job`, None without ray[default]
    env: dict[str, str]  # the token: a driver and `ray job` need it as much as the nodes


def start_node(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """``ray start ... --block``; returns once the node runs (its log says so)."""
    proc = subprocess.Popen([*RAY, "start", *args, "--block"], env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while "Ray runtime started" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)
    return proc


@pytest.fixture(scope="module")
def cluster():
    """A head and a second node with 1 CPU each; both stopped, and checked for leftovers, afterwards."""
    temp_dir = Path(tempfile.mkdtemp(prefix="colorl-mn-", dir="/tmp"))  # short: Ray's socket paths are limited
    env = {**child_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    port, dashboard_port = free_port(), free_port()
    dashboard = has_dashboard()

    def common(name: str) -> list[str]:
        # two nodes on one machine, each with a temp dir (logs, sockets, unpacked job files) and agent port of its own
        return [
            "--num-cpus=1",
            f"--temp-dir={temp_dir / name}",
            "--disable-usage-stats",
            f"--dashboard-agent-listen-port={free_port()}",
        ]

    nodes = []
    try:
        nodes.append(
            start_node(
                [
                    "--head",
                    f"--port={port}",
                    f"--include-dashboard={str(dashboard).lower()}",
                    f"--dashboard-port={dashboard_port}",
                    *common("h"),
                ],
                env,
                temp_dir / "head.log",
            )
        )
        nodes.append(
            start_node(
                [f"--address=127.0.0.1:{port}", f"--node-ip-address={SECOND_NODE_IP}", *common("n")],
                env,
                temp_dir / "node2.log",
            )
        )
        yield Cluster(
            f"127.0.0.1:{port}",
            f"http://127.0.0.1:{dashboard_port}" if dashboard else None,
            {k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")},
        )
    finally:
        tree = Run(0, "", "", 0.0)
        for node in nodes:
            tree.descendants |= {(p.pid, p.create_time()) for p in psutil.Process(node.pid).children(recursive=True)}
        for node in reversed(nodes):
            node.terminate()  # `ray start --block` stops its node's processes on SIGTERM
            node.wait(60)
        assert tree.survivors() == []
        shutil.rmtree(temp_dir, ignore_errors=True)


def overrides(run_dir: Path, assets: Path, nnodes: int, steps: int) -> list[str]:
    return [*tiny_overrides(run_dir, assets, steps=steps), f"trainer.nnodes={nnodes}", "trainer.n_gpus_per_node=1"]


def placement(stdout: str) -> list[tuple[str, str, str]]:
    """(rank, node ip, node id prefix) per rank, from the trainer's ``[colorl] workers:`` line."""
    line = next(line for line in stdout.splitlines() if line.startswith("[colorl] workers:"))
    return PLACED.findall(line)


def test_a_driver_without_the_token_is_refused(cluster, tmp_path, assets):
    """The cluster checks a token (RAY_AUTH_MODE=token on every node): a driver with another one cannot join."""
    run = run_child(
        [str(REPO / "main.py"), *overrides(tmp_path, assets, nnodes=2, steps=1), f"ray_init.address={cluster.address}"],
        cwd=tmp_path,
        env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)},
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert (
        f"colorl: config error: ray_kwargs.ray_init.address='{cluster.address}': cannot join that Ray cluster"
        in run.stderr
    )
    assert not (tmp_path / "metrics.jsonl").exists()


def test_ranks_on_two_nodes_meet_at_rank_zeros_node_address(cluster):
    probe = subprocess.run(
        [sys.executable, str(REPO / "tests/reliability/multinode_probe.py"), cluster.address, "2"],
        env={**child_env(), **cluster.env},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads(probe.stdout.splitlines()[-1])
    ranks = seen["ranks"]
    assert len(seen["nodes"]) == 2 and SECOND_NODE_IP in seen["nodes"].values()
    assert {r["node_id"] for r in ranks} == set(seen["nodes"])  # one rank on each node
    for r in ranks:
        assert r["node_ip"] == seen["nodes"][r["node_id"]]
        assert r["master_addr"] == ranks[0]["node_ip"]  # rank 0's node, as Ray knows it
        assert (r["backend"], r["sum"]) == ("gloo", 3.0)  # 1 + 2: both ranks were in one world
    assert ranks[1]["node_ip"] != ranks[0]["node_ip"]  # so rank 1 reached another node's address


def test_two_nodes_train_and_checkpoint_then_resume_on_one(cluster, tmp_path, assets):
    two = run_child(
        [str(REPO / "main.py"), *overrides(tmp_path, assets, nnodes=2, steps=1), f"ray_init.address={cluster.address}"],
        cwd=tmp_path,
        env=cluster.env,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    placed = placement(two.stdout)
    assert [rank for rank, _, _ in placed] == ["0", "1"]
    assert len({node for _, _, node in placed}) == 2 and SECOND_NODE_IP in {ip for _, ip, _ in placed}
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "1"

    one = run_child(
        [str(REPO / "main.py"), *overrides(tmp_path, assets, nnodes=1, steps=2), f"ray_init.address={cluster.address}"],
        cwd=tmp_path,
        env=cluster.env,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert len(placement(one.stdout)) == 1
    assert f"[colorl] resumed from {tmp_path / 'global_step_1'} (step 1)" in one.stdout
    steps = re.findall(r'"step": (\d+)', (tmp_path / "metrics.jsonl").read_text())
    assert steps == ["1", "2"]
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"


def test_ray_job_submit_runs_on_both_nodes(cluster, tmp_path, assets):
    if cluster.dashboard is None:
        pytest.skip("`ray job submit` needs Ray's dashboard: pip install 'ray[default]==2.60.0'")
    # a relative output dir: each node's workers run in their own copy of the job's working dir, yet all of
    # them must write the checkpoint's shards into the one the driver made
    run_dir = Path("outputs/job")
    job = run_child(
        [
            *RAY[1:],
            "job",
            "submit",
            f"--address={cluster.dashboard}",
            f"--working-dir={REPO}",
            "--",
            sys.executable,
            "main.py",
            *overrides(run_dir, assets, nnodes=2, steps=1),
        ],
        cwd=tmp_path,
        env=cluster.env,
    )
    assert job.returncode == 0, (job.stdout + job.stderr)[-3000:]
    assert "succeeded" in job.stdout + job.stderr
    assert len({node for _, _, node in placement(job.stdout)}) == 2  # the job's output is streamed back
