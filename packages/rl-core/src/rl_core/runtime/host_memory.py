"""Let glibc keep freed host memory for reuse, so that XLA:CPU programs stop page-faulting.

XLA:CPU mallocs each program's temporary buffers on every execution. glibc serves
blocks above its mmap threshold (which it adapts, up to 32 MiB) with fresh pages
from mmap and unmaps them on free, so each execution of a training step pays a
page fault for every 4 KiB it touches: about 16,000 faults per tiny-qwen2 GRPO
step on a 2-core CPU, about a sixth of the step. With higher mmap and trim
thresholds glibc keeps that memory and hands it back on the next malloc, as a
caching allocator does on an accelerator. The cost is that a process holds on
to its peak heap instead of returning it to the system.

The thresholds alone hold only up to 64 MiB: XLA:CPU runs programs on threads of
its own, and glibc gives each such thread an arena of its own whose heaps are at
most 64 MiB, so a larger temporary buffer (a tiny-qwen2 update at 64 rows of 16
positions or more: 73 MiB at 16, 105 at 24) is mmapped and unmapped on every
execution whatever the thresholds say: 18,000-27,000 page faults per update,
a third of its time. One arena for the whole process (M_ARENA_MAX = 1) serves
every thread from the main heap, which grows past that; at 15 positions, where the
buffer fit anyway, the bench measured the same step either way.

This is a process-wide setting, so applications call it (the trainer's command
line, the test suite, benchmarks); importing rl_core never does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# glibc's <malloc.h> parameter numbers for mallopt(3)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

DEFAULT_THRESHOLD = 1 << 30
"""Blocks up to 1 GiB come from the reusable heap; larger ones are still mmapped."""


def keep_freed_memory(threshold_bytes: int = DEFAULT_THRESHOLD) -> bool:
    """Raise glibc's mmap and trim thresholds to `threshold_bytes`, and let threads
    started afterwards share the main arena (see the module docstring): call it
    before the first JAX computation, which starts XLA's threads.

    Returns True when applied; False where there is nothing to tune (not
    glibc, e.g. macOS or musl), which is not an error.
    """
    if threshold_bytes < 1:
        raise ValueError(f"threshold_bytes={threshold_bytes}: must be >= 1")
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    # mallopt returns 1 on success; setting the mmap threshold also turns off glibc's
    # dynamic adjustment of it
    return all(libc.mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, threshold_bytes), (_M_TRIM_THRESHOLD, threshold_bytes), (_M_ARENA_MAX, 1)))
