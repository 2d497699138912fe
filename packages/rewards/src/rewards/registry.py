"""Reward functions by name: the entry-point group ``rewards.functions``, plus user code.

A name in a config (``rewards: {x: {function: NAME}}``) is one of:

- a registered name: an entry point of the group ``rewards.functions`` that points at a
  factory; ``make_reward(name, **options)`` calls it with the reward's options. This
  package declares its built-ins there like any third-party package declares its own
  (``[project.entry-points."rewards.functions"] mine = "my_pkg.rewards:mine"``); nothing
  registers by import, and one name from two distributions is an error naming both (rl_plugins
  loads the group, as every table of plugins does);
- ``module:function`` or ``path/to/file.py:function``: the reward function itself (TRL's
  signature works: see ``rewards.manager``); its options are bound as keyword arguments.

``REWARD_FUNCTIONS`` is the read-only table of registered names (entry points load on
first use).
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterator, Mapping

import rl_plugins as plugins

from rewards.code import is_code_reference, load_object

__all__ = ["ENTRY_POINT_GROUP", "REWARD_FUNCTIONS", "RewardFn", "make_reward", "reward_factory"]

ENTRY_POINT_GROUP = plugins.REWARD_FUNCTIONS

RewardFn = Callable[..., list[float]]
"""``fn(prompts, completions, **fields) -> list[float | None]``, one score per completion."""


class _Registered(Mapping):
    """The entry points of ``rewards.functions``, loaded once, read-only."""

    def __init__(self) -> None:
        self._table: dict[str, Callable[..., RewardFn]] | None = None

    def _load(self) -> dict[str, Callable[..., RewardFn]]:
        if self._table is None:
            found = plugins.one_per_name(ENTRY_POINT_GROUP, "reward function")
            self._table = {name: plugin.load() for name, plugin in found.items()}
        return self._table

    def __getitem__(self, name: str) -> Callable[..., RewardFn]:
        return self._load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


REWARD_FUNCTIONS: Mapping[str, Callable[..., RewardFn]] = _Registered()


def reward_factory(name: str) -> Callable[..., RewardFn]:
    """The registered factory `name`; an unknown name says what exists, the closest name and the fix."""
    if name in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[name]
    close = difflib.get_close_matches(str(name), list(REWARD_FUNCTIONS), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"unknown reward function {name!r}; known: {', '.join(REWARD_FUNCTIONS)}.{hint} Your own: "
        f"'module:function' or 'path/to/file.py:function', or an entry point of the group {ENTRY_POINT_GROUP!r}"
    )


def make_reward(name: str, **options: object) -> RewardFn:
    """The reward function that `name` names (a registered name or a code reference), with `options`."""
    if is_code_reference(name):
        fn = load_object(name, "reward function")
        if not callable(fn):
            raise ValueError(f"reward function {name!r} is a {type(fn).__name__}, not a function")
        if not options:
            return fn
        bound = functools.partial(fn, **options)
        bound.__name__ = getattr(fn, "__name__", name.split(":")[1])
        return bound
    return reward_factory(name)(**options)
