"""The benchmarks' clock: seconds of each call of a function, blocked until its arrays are ready."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax


def times(fn: Callable[[], Any], repeats: int, *, warm: bool = True) -> list[float]:
    """Seconds of each of `repeats` calls of `fn` (each waits for the arrays it returns), after one
    untimed call that compiles; `warm=False` when the caller made that call itself."""
    if warm:
        jax.block_until_ready(fn())
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - start)
    return out
