"""glibc keeps freed blocks for reuse after keep_freed_memory(): no page faults on reuse."""

import ctypes
import ctypes.util
import mmap
import platform
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from rl_core.runtime.host_memory import _M_MMAP_THRESHOLD, keep_freed_memory

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc"
)
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# with transparent huge pages always on, a fresh mapping faults once per 2 MiB, too few to tell apart
thp_always = pytest.mark.skipif(THP.exists() and "[always]" in THP.read_text(), reason="THP always on")


def _kernel_counts_page_faults() -> bool:
    """Whether touching a fresh mapping shows in getrusage: gVisor (a TPU host's `runsc`,
    2026-12-07) reports 0 minor faults, always, so these tests cannot measure there."""
    fresh = mmap.mmap(-1, 1 << 20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for offset in range(0, len(fresh), 4096):
        fresh[offset] = 1
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    fresh.close()
    return faults > 0


counts_faults = pytest.mark.skipif(
    platform.system() == "Linux" and not _kernel_counts_page_faults(),
    reason="this kernel counts no page faults (getrusage's ru_minflt stays 0, as under gVisor)",
)
BLOCK = 64 << 20  # like an XLA program's temporary buffers: above glibc's default mmap threshold
PAGES = BLOCK // 4096


def _faults_of_reuse(libc: ctypes.CDLL) -> int:
    """Minor page faults of three malloc / write every page / free rounds, after a first one."""

    def round_trip():
        ptr = libc.malloc(ctypes.c_size_t(BLOCK))
        assert ptr, "malloc failed"
        ctypes.memset(ptr, 1, BLOCK)
        libc.free(ctypes.c_void_p(ptr))

    round_trip()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        round_trip()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@glibc_only
@thp_always
@counts_faults
def test_freed_blocks_are_reused_without_page_faults():
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    try:
        assert libc.mallopt(_M_MMAP_THRESHOLD, 128 << 10)  # glibc's default: big blocks are mmapped
        assert _faults_of_reuse(libc) > 2 * PAGES  # every round faults its pages in again
        assert keep_freed_memory()
        assert _faults_of_reuse(libc) < PAGES // 10
    finally:
        keep_freed_memory()  # the suite runs with it (tests/conftest.py)


# In a thread other than the main one (XLA:CPU runs its programs on such threads), with only the
# thresholds raised or with keep_freed_memory() before the thread starts: the faults of reusing a
# block larger than a thread arena's 64 MiB heap.
THREAD_REUSE = """
import ctypes, ctypes.util, resource, sys, threading
from rl_core.runtime import host_memory
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
if sys.argv[1] == "thresholds":
    assert libc.mallopt(host_memory._M_MMAP_THRESHOLD, 1 << 30) and libc.mallopt(host_memory._M_TRIM_THRESHOLD, 1 << 30)
else:
    assert host_memory.keep_freed_memory()
BLOCK = 96 << 20
def round_trip():
    ptr = libc.malloc(ctypes.c_size_t(BLOCK))
    assert ptr, "malloc failed"
    ctypes.memset(ptr, 1, BLOCK)
    libc.free(ctypes.c_void_p(ptr))
def work():
    round_trip()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        round_trip()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
thread = threading.Thread(target=work)
thread.start()
thread.join()
"""


@glibc_only
@thp_always
@counts_faults
def test_threads_reuse_blocks_beyond_their_arenas_heap_size():
    def faults(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", THREAD_REUSE, mode], capture_output=True, text=True, check=True)
        return int(done.stdout)

    pages = (96 << 20) // 4096
    assert faults("thresholds") > 2 * pages  # the thread's own arena cannot hold it: mmapped every time
    assert faults("keep_freed_memory") < pages // 10


def test_rejects_a_non_positive_threshold():
    with pytest.raises(ValueError, match="threshold_bytes=0"):
        keep_freed_memory(0)
