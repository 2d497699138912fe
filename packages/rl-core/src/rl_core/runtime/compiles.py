"""XLA programs: count them, and keep them on disk between runs.

`compile_count()` is the number of programs this process has compiled or
loaded from the persistent cache so far, and `compile_seconds()` the seconds
that took; a run whose count stops growing after its first step has a fixed
set of programs. Eager array ops compile too, so compare counts around steps.

`use_persistent_cache(directory)` turns on JAX's persistent compilation cache:
a later run, seed or process that builds the same program (same HLO, devices
and flags) loads it instead of compiling it again.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import jax
from jax import monitoring

_EVENT = "/jax/core/compile/backend_compile_duration"
"""Timed around compiling or loading from the persistent cache: every new program counts."""
_lock = threading.Lock()
_count = 0
_seconds = 0.0
_installed = False

CACHE_MAX_BYTES = 2 * 1024**3
"""Least recently used programs are evicted beyond this size on disk."""
CACHE_MIN_COMPILE_SECS = 0.1
"""Programs that compile faster are not kept (see `use_persistent_cache`)."""


def _listener(event: str, duration_secs: float, **_: object) -> None:
    global _count, _seconds
    if event == _EVENT:
        with _lock:
            _count += 1
            _seconds += duration_secs


def install() -> None:
    """Start counting (idempotent; JAX offers no way to remove a listener)."""
    global _installed
    with _lock:
        if not _installed:
            monitoring.register_event_duration_secs_listener(_listener)
            _installed = True


def compile_count() -> int:
    install()
    return _count


def compile_seconds() -> float:
    """Seconds this process has spent compiling programs or loading them from the persistent cache
    (XLA's part: tracing and lowering before it are not counted)."""
    install()
    return _seconds


def use_persistent_cache(
    directory: str | Path, max_bytes: int = CACHE_MAX_BYTES, min_compile_secs: float = CACHE_MIN_COMPILE_SECS
) -> None:
    """Keep compiled programs in `directory` (call before the first compile).

    Programs that took `min_compile_secs` or more to compile are kept: far
    below JAX's default 1 s, as XLA:CPU compiles most of a run's programs in
    less, but above the milliseconds of eager array ops. Those are not worth
    an entry: JAX's size-limited cache scans every entry on every write to
    evict, so thousands of tiny entries make each write cost more than the
    compile it saves. The size limit makes JAX lock the folder for reads
    and writes, so concurrent processes never read a half-written entry, and
    evict by access time. The same settings go into the environment, so that
    child processes (which read them when they import jax) write entries the
    same way: an entry written without its access-time file breaks eviction.
    """
    Path(directory).mkdir(parents=True, exist_ok=True)
    settings = {
        "jax_compilation_cache_dir": str(directory),
        "jax_persistent_cache_min_compile_time_secs": float(min_compile_secs),
        "jax_compilation_cache_max_size": max_bytes,
    }
    for name, value in settings.items():
        jax.config.update(name, value)
        os.environ[name.upper()] = str(value)
