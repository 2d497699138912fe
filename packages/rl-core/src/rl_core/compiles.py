"""XLA programs: count them, and keep them on disk between runs.

`compile_count()` is the number of programs this process has compiled or
loaded from the persistent cache so far; a run whose count stops growing after
its first step has a fixed set of programs. Eager array ops compile too, so
compare counts around steps.

`use_persistent_cache(directory)` turns on JAX's persistent compilation cache:
a later run, seed or process that builds the same program (same HLO, devices
and flags) loads it instead of compiling it again.
"""

from __future__ import annotations

import threading
from pathlib import Path

import jax
from jax import monitoring

_COMPILED = "/jax/core/compile/backend_compile_duration"
_LOADED = "/jax/compilation_cache/cache_hits"
_lock = threading.Lock()
_count = 0
_installed = False

CACHE_MAX_BYTES = 2 * 1024**3
"""Least recently used programs are evicted beyond this size on disk."""


def _count_one() -> None:
    global _count
    with _lock:
        _count += 1


def _on_duration(event: str, duration_secs: float, **_: object) -> None:
    if event == _COMPILED:
        _count_one()


def _on_event(event: str, **_: object) -> None:
    if event == _LOADED:  # a program loaded from disk is still a new program for this process
        _count_one()


def install() -> None:
    """Start counting (idempotent; JAX offers no way to remove a listener)."""
    global _installed
    with _lock:
        if not _installed:
            monitoring.register_event_duration_secs_listener(_on_duration)
            monitoring.register_event_listener(_on_event)
            _installed = True


def compile_count() -> int:
    install()
    return _count


def use_persistent_cache(directory: str | Path, max_bytes: int = CACHE_MAX_BYTES) -> None:
    """Keep every compiled program in `directory` (call before the first compile).

    Small programs are kept too (XLA:CPU compiles most in well under JAX's
    default 1 s threshold). A size limit makes JAX lock the folder for reads
    and writes, so concurrent processes never read a half-written entry.
    """
    Path(directory).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_compilation_cache_max_size", max_bytes)
