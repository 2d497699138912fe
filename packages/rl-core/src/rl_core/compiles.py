"""Count XLA compilations through JAX's monitoring hooks.

`compile_count()` is the number of backend compilations in this process so
far; a run whose count stops growing after its first step has a fixed set of
programs. Eager array ops compile too, so compare counts around steps.
"""

from __future__ import annotations

import threading

from jax import monitoring

_EVENT = "/jax/core/compile/backend_compile_duration"
_lock = threading.Lock()
_count = 0
_installed = False


def _listener(event: str, duration_secs: float, **_: object) -> None:
    global _count
    if event == _EVENT:
        with _lock:
            _count += 1


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
