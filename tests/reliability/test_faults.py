"""Faults named in one line (``trainer.running.faults``): an exception in a worker, out of memory, a full object
store."""

import json
import subprocess
import sys

import pytest
import torch

from single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from single_controller.base.register import Dispatch, register
from single_controller.base.worker import Worker
from single_controller.ray.health import shutdown_worker_group
from tests.reliability.conftest import REPO, child_env, tmpfs
from trainer.running.faults import STORE_HINT, named


class Faulty(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_actor(self, fail_rank: int, kind: str) -> int:
        if self.rank == fail_rank and kind == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if self.rank == fail_rank:
            raise ValueError("no 'advantages' in the batch")
        return self.rank


@pytest.fixture(scope="module")
def group(ray_cluster):
    wg = RayWorkerGroup(RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(Faulty))
    yield wg
    shutdown_worker_group(wg)


def where(process: dict) -> str:
    return f"pid {process['pid']} on node {process['node_ip']} ({process['host']})"


def test_a_worker_exception_keeps_its_type_and_is_named_in_one_line(group):
    with pytest.raises(ValueError) as info:  # as the worker raised it: callers may catch it as what it is
        group.update_actor(1, "value")
    assert str(named(info.value)) == (
        f"worker rank 1 of 2 raised ValueError during Faulty.update_actor: "
        f"{where(group.processes[1])}; no 'advantages' in the batch"
    )


def test_out_of_memory_also_names_the_micro_batch_keys_to_lower(group):
    with pytest.raises(torch.OutOfMemoryError) as info:
        group.update_actor(0, "oom")
    assert str(named(info.value)) == (
        f"worker rank 0 of 2 raised OutOfMemoryError during Faulty.update_actor: {where(group.processes[0])}; "
        "CUDA out of memory. Tried to allocate 2.00 GiB; out of memory: lower "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (ppo_max_token_len_per_gpu with use_dynamic_bsz)"
    )


@pytest.mark.slow  # fills a Ray object store of its own: ~17 s
def test_a_full_object_store_is_named_as_such(tmp_path):
    with tmpfs(tmp_path / "store", "100M") as store:
        probe = subprocess.run(
            [sys.executable, str(REPO / "tests/reliability/object_store_probe.py"), str(store)],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=240,
        )
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads(probe.stdout.splitlines()[-1])
    assert seen["worker"] == (
        f"worker rank 1 of 2 raised OutOfDiskError during Hoarder.generate_sequences: "
        f"{where(seen['rank1'])}; Local disk is full: {STORE_HINT}"
    )
    assert seen["driver"] == STORE_HINT
