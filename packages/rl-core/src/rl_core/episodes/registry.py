"""Environments by name: registered directly or found through entry points.

A package declares its environments in the entry-point group
`rl_core.environments`, each pointing at a factory (a class or a function
taking the environment's options as keywords and returning a fresh
`rl_core.episodes.env.Environment`):

    [project.entry-points."rl_core.environments"]
    calculator = "trainer.environments:calculator"

`rollout.environment` names one; the name is checked when the config is built.
"""

from __future__ import annotations

import difflib
import importlib.metadata as metadata
from collections.abc import Callable

from rl_core.episodes.env import EnvironmentFactory

ENTRY_POINT_GROUP = "rl_core.environments"


class UnknownEnvironmentError(LookupError):
    """An environment name that nothing registers, or whose entry point failed to load."""


_factories: dict[str, tuple[EnvironmentFactory, str]] = {}
_failures: dict[str, str] = {}
_loaded = False


def register_environment(name: str, factory: EnvironmentFactory, *, provider: str = "direct") -> EnvironmentFactory:
    """Register `factory` as `name`; the same factory twice is a no-op, another one is an error."""
    if not callable(factory):
        raise TypeError(f"environment {name!r}: the factory {factory!r} is not callable")
    known = _factories.get(name)
    if known is not None and known[0] is not factory:
        raise UnknownEnvironmentError(
            f"environment {name!r} is registered twice: by {known[1]} ({known[0]!r}) and by {provider} "
            f"({factory!r}); rename one of them"
        )
    _factories[name] = (factory, provider)
    return factory


def _load_entry_points() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else "unknown distribution"
        try:
            register_environment(ep.name, ep.load(), provider=dist)
        except Exception as e:  # noqa: BLE001 - one broken plugin must not hide the others
            _failures[ep.name] = f"entry point {ep.name!r} of {dist!r} failed to load: {type(e).__name__}: {e}"


def environment_names() -> list[str]:
    """Every registered environment name (entry points loaded)."""
    _load_entry_points()
    return sorted(_factories)


def get_environment(name: str) -> EnvironmentFactory:
    """The factory registered as `name`; an unknown name says what exists and how to add one."""
    if name not in _factories:
        _load_entry_points()
    if name in _factories:
        return _factories[name][0]
    known = ", ".join(f"{n} (from {p})" for n, (_, p) in sorted(_factories.items())) or "none"
    lines = [f"unknown environment {name!r}. Known: {known}."]
    close = difflib.get_close_matches(name, list(_factories), n=1)
    if close:
        lines.append(f"Did you mean {close[0]!r}?")
    if name in _failures:
        lines.append(f"It is installed but failed to load: {_failures[name]}")
    else:
        lines.append(f"Install a package that declares it in the entry-point group {ENTRY_POINT_GROUP!r}.")
    raise UnknownEnvironmentError(" ".join(lines))


def environment_factory(name: str, options: dict) -> Callable[[], object]:
    """A no-argument factory of fresh environments `name` with `options`."""
    factory = get_environment(name)
    return lambda: factory(**options)
