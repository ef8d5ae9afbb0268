"""``workers.runtime.malloc``: mimalloc preloaded into CPU workers; glibc's fallback keeps freed activation-sized blocks
resident for the next step."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from workers.runtime import malloc

REPO = Path(__file__).resolve().parents[2]

# A "step": 64 blocks of 1 MiB allocated, written and freed together, as a forward's activations are after the
# backward. Prints the minor page faults of each step after the first.
STEPS = """
import ctypes, resource
from workers.runtime import malloc
print(malloc.keep_freed_memory())
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
faults = []
for step in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(1 << 20) for _ in range(64)]
    for block in blocks:
        ctypes.memset(block, 1, 1 << 20)
    for block in blocks:
        libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(max(faults[1:]))
"""


def run_steps(**env: str) -> tuple[str, int]:
    result = subprocess.run(
        [sys.executable, "-c", STEPS],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    applied, faults = result.stdout.split()
    return applied, int(faults)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt tuning applies to glibc only")
def test_freed_blocks_are_reused_without_page_faults():
    applied, faults = run_steps()
    assert applied == "True"
    assert faults < 64 * 256 // 100  # under 1 % of the 64 MiB (16,384 pages) each step writes


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt tuning applies to glibc only")
def test_user_malloc_settings_win():
    applied, _ = run_steps(MALLOC_TRIM_THRESHOLD_="131072")
    assert applied == "False"


@pytest.mark.skipif(platform.system() != "Linux", reason="mimalloc is preloaded on Linux")
def test_cpu_workers_preload_mimalloc_after_the_users_libraries(monkeypatch):
    library = malloc.mimalloc_library()
    assert library is not None and Path(library).is_file()
    monkeypatch.delenv("MIMALLOC_PURGE_DELAY", raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/opt/user/libhook.so")
    assert malloc.worker_env("cpu") == {"LD_PRELOAD": f"/opt/user/libhook.so:{library}", "MIMALLOC_PURGE_DELAY": "-1"}
    monkeypatch.setenv("MIMALLOC_PURGE_DELAY", "10")  # the user's setting wins
    assert malloc.worker_env("cpu")["MIMALLOC_PURGE_DELAY"] == "10"
    assert malloc.worker_env("cuda") == {}


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt tuning applies to glibc only")
def test_glibc_is_left_alone_under_mimalloc():
    """With mimalloc preloaded glibc's malloc is unused: no mallopt, and freed blocks are still reused."""
    applied, faults = run_steps(**malloc.worker_env("cpu"))
    assert applied == "False"
    assert faults < 64 * 256 // 100


def test_a_rollout_group_beside_the_trainers_shares_the_nodes_cores(monkeypatch):
    """Two groups on one node (separate_async): each worker's threads are the cores over both groups' workers."""
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.delenv(malloc.NODE_WORKERS, raising=False)
    assert malloc.compute_threads(local_world_size=2) == 4
    assert malloc.worker_env("cpu", node_workers=4)[malloc.NODE_WORKERS] == "4"
    assert malloc.NODE_WORKERS not in malloc.worker_env("cuda", node_workers=4)
    monkeypatch.setenv(malloc.NODE_WORKERS, "4")
    assert malloc.compute_threads(local_world_size=2) == 2
