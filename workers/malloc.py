"""Host-memory allocator settings for processes that train on the CPU.

PyTorch's CPU tensors come straight from the C library's ``malloc`` (there is no caching allocator on the host,
unlike CUDA's). An eager training step allocates and frees the same activation-sized blocks every step, and
glibc's defaults hand many of them back to the kernel: blocks above its mmap threshold are ``munmap``-ed on free,
and a free top of the heap above the trim threshold is trimmed. The next step then faults every page back in,
zeroed by the kernel. Keeping freed memory instead makes eager CPU updates faster at the same peak RSS
(docs/benchmarks.md, "Host memory allocator").
"""

from __future__ import annotations

import ctypes
import os
import platform

# mallopt parameter numbers from glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

# Blocks up to 32 MiB (the ceiling glibc's own dynamic threshold can rise to) come from the heap and are reused.
MMAP_THRESHOLD = 32 << 20
# A free heap top is returned to the kernel only above 1 GiB: the next step would fault it straight back in.
TRIM_THRESHOLD = 1 << 30
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


def keep_freed_memory() -> bool:
    """Make glibc keep freed blocks for reuse instead of returning them to the kernel; True if applied.

    The process's RSS then stays at its high-water mark (which is what bounds it anyway: the peak does not
    change). Does nothing where the C library is not glibc, or where the user set glibc's malloc tunables in
    the environment (``MALLOC_*_`` or ``GLIBC_TUNABLES``): theirs win.
    """
    if platform.libc_ver()[0] != "glibc" or any(name in os.environ for name in _USER_SETTINGS):
        return False
    libc = ctypes.CDLL(None)  # the C library this process already has loaded
    applied = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return bool(applied)
