"""Let glibc keep freed host memory for reuse, so that XLA:CPU programs stop page-faulting.

XLA:CPU mallocs each program's temporary buffers on every execution. glibc serves
blocks above its mmap threshold (which it adapts, up to 32 MiB) with fresh pages
from mmap and unmaps them on free, so each execution of a training step pays a
page fault for every 4 KiB it touches: about 16,000 faults per tiny-qwen2 GRPO
step on a 2-core CPU, about a sixth of the step. With higher mmap and trim
thresholds glibc keeps that memory and hands it back on the next malloc, as a
caching allocator does on an accelerator. The cost is that a process holds on
to its peak heap instead of returning it to the system.

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

DEFAULT_THRESHOLD = 1 << 30
"""Blocks up to 1 GiB come from the reusable heap; larger ones are still mmapped."""


def keep_freed_memory(threshold_bytes: int = DEFAULT_THRESHOLD) -> bool:
    """Raise glibc's mmap and trim thresholds to `threshold_bytes`.

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
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold_bytes)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, threshold_bytes)
    )
