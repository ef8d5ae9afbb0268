"""The host-memory allocator of processes that train on the CPU.

PyTorch's CPU tensors come straight from the C library's ``malloc`` (there is no caching allocator on the host,
unlike CUDA's), and glibc's serves an eager training step badly either way:

- with its defaults, blocks above the mmap threshold are ``munmap``-ed on free and a free heap top is trimmed, so
  each step faults every activation page back in, zeroed by the kernel (a SmolLM2 update about twice as slow);
- kept on its heap instead (:func:`keep_freed_memory`), the step's blocks fragment it: small long-lived
  allocations land between the freed activations, so the next step's do not fit the holes and the heap grows: a
  SmolLM2 update's peak RSS is 1.5–3× mimalloc's (docs/benchmarks.md, "Host memory allocator").

mimalloc (``cmeel-mimalloc``) reuses freed blocks by size class, without either cost. It must be in place before
the process allocates anything, so it is preloaded (``LD_PRELOAD``) into the workers when Ray starts them
(:func:`worker_env`); :func:`keep_freed_memory` is the fallback where it is not installed.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import platform
import sys

# mallopt parameter numbers from glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

# Blocks up to 32 MiB (the ceiling glibc's own dynamic threshold can rise to) come from the heap and are reused.
MMAP_THRESHOLD = 32 << 20
# A free heap top is returned to the kernel only above 1 GiB: the next step would fault it straight back in.
TRIM_THRESHOLD = 1 << 30
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


def mimalloc_library() -> str | None:
    """The path of the mimalloc shared library that ``cmeel-mimalloc`` installs (Linux), or None."""
    try:
        files = importlib.metadata.files("cmeel-mimalloc") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    libraries = [f for f in files if f.name == "libmimalloc.so"]
    return str(libraries[0].locate()) if libraries and platform.system() == "Linux" else None


NODE_WORKERS = "COLORL_NODE_WORKERS"  # the worker processes of every group on a node: they share its cores


def compute_threads(local_world_size: int) -> int:
    """Threads of one CPU worker: the node's cores over the workers sharing them (``NODE_WORKERS`` when a second
    group runs beside this one, a rollout group of its own; else this group's). Fewer workers than threads on the
    cores: OpenMP's spinning threads would preempt each other (a step 5-10× slower)."""
    sharers = int(os.environ.get(NODE_WORKERS, local_world_size))
    return max(1, (os.cpu_count() or 1) // sharers)


def worker_env(device: str, node_workers: int | None = None) -> dict[str, str]:
    """Environment variables for a worker process on ``device``: on a CPU, mimalloc preloaded where installed
    (after any library the user preloads), keeping freed memory for the next step (``MIMALLOC_PURGE_DELAY=-1``:
    no page faults re-fetching it; the RSS stays at its peak, which bounds it anyway) unless the user set it. The
    path is the driver's: on a node without it the loader ignores the preload, with a warning, and glibc serves.
    ``node_workers``: the workers of every group on a node, when more than this group's (``compute_threads``)."""
    shared = {NODE_WORKERS: str(node_workers)} if node_workers and device == "cpu" else {}
    library = mimalloc_library() if device == "cpu" else None
    if library is None:
        return shared
    preload = [path for path in os.environ.get("LD_PRELOAD", "").split(":") if path]
    return {
        "LD_PRELOAD": ":".join(preload if library in preload else [*preload, library]),
        "MIMALLOC_PURGE_DELAY": os.environ.get("MIMALLOC_PURGE_DELAY", "-1"),
        **shared,
    }


def rerun_with_worker_allocator(device: str) -> None:
    """Start this command again under :func:`worker_env`'s allocator unless it runs with it already, so that a
    single-process benchmark allocates as the trainer's workers do."""
    env = worker_env(device)
    if env and env["LD_PRELOAD"] != os.environ.get("LD_PRELOAD"):  # once: a preload that failed must not loop
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **env})


def uses_mimalloc() -> bool:
    """Whether this process's ``malloc`` is mimalloc's (preloaded)."""
    with open("/proc/self/maps") as maps:
        return any("libmimalloc" in line for line in maps)


def keep_freed_memory() -> bool:
    """Make glibc keep freed blocks for reuse instead of returning them to the kernel; True if applied.

    The process's RSS then stays at its high-water mark, faster than glibc's defaults but larger (fragmented: see
    the module docstring). Does nothing where the C library is not glibc, where mimalloc is preloaded (glibc's
    ``malloc`` is then unused), or where the user set glibc's malloc tunables in the environment (``MALLOC_*_`` or
    ``GLIBC_TUNABLES``): theirs win.
    """
    if platform.libc_ver()[0] != "glibc" or any(name in os.environ for name in _USER_SETTINGS) or uses_mimalloc():
        return False
    libc = ctypes.CDLL(None)  # the C library this process already has loaded
    applied = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return bool(applied)
