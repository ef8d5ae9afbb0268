"""Worker liveness on a real Ray cluster: a dead rank is named at once, stacks are dumped, teardown is complete."""

import contextlib
import os
import signal
import threading
import time

import psutil
import pytest
import ray
import torch
import torch.distributed as dist

from single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from single_controller.base.register import Dispatch, register
from single_controller.base.worker import Worker
from single_controller.ray import health
from single_controller.ray.health import WorkerDiedError, shutdown_worker_group, stall_report


class Collective(Worker):
    """Two ranks in a gloo world; ``die_rank`` leaves the others blocked in an all-reduce."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def setup(self) -> None:
        torch.set_num_threads(1)
        self.init_process_group()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce(self, die_rank: int = -1, raise_rank: int = -1) -> float:
        if self.rank == die_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.rank == raise_rank:
            raise ValueError(f"rank {self.rank} refuses")
        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def nap_on(self, rank: int, seconds: float) -> int:
        if self.rank == rank:
            time.sleep(seconds)
        return self.rank


@pytest.fixture
def group(ray_cluster):
    wg = RayWorkerGroup(RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(Collective))
    wg.setup()
    yield wg
    shutdown_worker_group(wg)


def gone(pids: list[int], within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.2)
    return False


def test_a_killed_rank_is_named_within_seconds_and_nothing_is_left(group):
    assert group.all_reduce() == [2.0, 2.0]
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        group.all_reduce(die_rank=1)  # rank 0 stays blocked in the collective
    assert time.monotonic() - start < 15
    err, victim = info.value, group.processes[1]
    assert (err.rank, err.call, err.process["pid"]) == (1, "Collective.all_reduce", victim["pid"])
    where = f"pid {victim['pid']} on node {victim['node_ip']}"
    assert f"worker rank 1 of 2 died during Collective.all_reduce: {where}" in str(err)
    pgs = group.resource_pool.pgs
    shutdown_worker_group(group)
    assert gone([p["pid"] for p in group.processes])
    assert all(ray.util.placement_group_table(pg)["state"] == "REMOVED" for pg in pgs)


def test_a_worker_exception_surfaces_without_waiting_for_its_peers(group):
    start = time.monotonic()
    with pytest.raises(ValueError, match="rank 1 refuses"):
        group.all_reduce(raise_rank=1)  # rank 0 would wait on rank 1 for gloo's whole timeout
    assert time.monotonic() - start < 15


@pytest.mark.parametrize("py_spy", [True, False], ids=["py-spy", "faulthandler"])
def test_stall_report_names_the_busy_rank_and_shows_its_stack(group, monkeypatch, py_spy):
    if not py_spy:
        monkeypatch.setattr(health, "_py_spy", lambda: None)
    elif health._py_spy() is None:
        pytest.skip("py-spy is not installed")

    def nap() -> None:
        with contextlib.suppress(WorkerDiedError):  # the fixture's teardown kills the napping rank
            group.nap_on(1, 30.0)

    threading.Thread(target=nap, daemon=True).start()
    deadline = time.monotonic() + 20
    while health.in_flight().get("Collective.nap_on") != [1] and time.monotonic() < deadline:
        time.sleep(0.1)
    report = stall_report(group.processes)
    assert "waiting on Collective.nap_on at rank(s) [1]" in report
    rank1 = report.split("--- rank 1")[1]
    assert "nap_on" in rank1 and "test_health.py" in rank1
