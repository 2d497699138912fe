"""The host side of the paged KV cache: which pages are free, and who holds each.

Page 0 is scratch (padding tokens write there, nobody reads it) and is never
handed out. A page is held by reference count: a prompt's prefix pages by the
prompt and by every sample decoding from it, a sample's own pages by that
sample alone; it returns to the free list when the last holder releases it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

SCRATCH = 0


class PoolExhausted(RuntimeError):
    """Not enough free pages for a request (the scheduler waits or preempts)."""


class PagePool:
    def __init__(self, num_pages: int) -> None:
        if num_pages < 2:
            raise ValueError(f"a page pool needs at least 2 pages (one is scratch), got {num_pages}")
        self.num_pages = num_pages
        self._refs = np.zeros(num_pages, np.int32)
        self._free: list[int] = []
        self.reset()

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def in_use(self) -> int:
        return self.num_pages - 1 - len(self._free)

    def allocate(self, n: int) -> list[int]:
        """`n` fresh pages, each held once; PoolExhausted (nothing taken) when fewer are free."""
        if n > len(self._free):
            raise PoolExhausted(f"{n} pages asked, {len(self._free)} of {self.num_pages - 1} free")
        pages = [self._free.pop() for _ in range(n)]
        self._refs[pages] = 1
        return pages

    def retain(self, pages: Iterable[int]) -> None:
        for p in pages:
            if self._refs[p] <= 0:
                raise ValueError(f"page {p} is free: it cannot be shared")
            self._refs[p] += 1

    def release(self, pages: Iterable[int]) -> None:
        for p in pages:
            if self._refs[p] <= 0:
                raise ValueError(f"page {p} released more often than held")
            self._refs[p] -= 1
            if self._refs[p] == 0:
                self._free.append(p)

    def reset(self) -> None:
        """Every page free again (a rollout's end, however it ended: nothing outlives it)."""
        self._refs[:] = 0
        self._free = list(range(self.num_pages - 1, SCRATCH, -1))  # pop() hands out low ids first

    def refcount(self, page: int) -> int:
        return int(self._refs[page])
