"""Tasks by name: the entry-point group ``trainer.tasks``, plus user code.

A task name in the settings (``--task NAME``, ``task.name: NAME``) is one of:

- a registered name: an entry point of the group ``trainer.tasks`` that points at a task
  factory (a function taking the task's options as keywords and returning a
  ``trainer.tasks.Task``). The trainer declares its built-in tasks there like any
  third-party package declares its own::

      [project.entry-points."trainer.tasks"]
      my_task = "my_pkg.tasks:my_task"

  nothing registers by import, and one name from two distributions is an error naming both (rl_plugins
  loads the group, as every table of plugins does);
- ``module:function`` or ``path/to/file.py:function``: the factory itself.

``TASKS`` is the read-only table of registered names (entry points load on first use).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping

import rl_plugins as plugins

from trainer.tasks.task import Task

__all__ = ["ENTRY_POINT_GROUP", "TASKS", "TaskError", "task_factory"]

ENTRY_POINT_GROUP = plugins.TASKS


class TaskError(ValueError):
    """A task name that names no task: unknown, registered twice, or code that does not load."""


class _Registered(Mapping):
    """The entry points of ``trainer.tasks``, loaded once, read-only."""

    def __init__(self) -> None:
        self._table: dict[str, Callable[..., Task]] | None = None

    def _load(self) -> dict[str, Callable[..., Task]]:
        if self._table is None:
            try:
                found = plugins.one_per_name(ENTRY_POINT_GROUP, "task")
                table = {name: plugin.load() for name, plugin in found.items()}
            except plugins.PluginError as e:  # a broken plugin is named, not a traceback
                raise TaskError(str(e)) from None
            self._table = dict(sorted(table.items()))
        return self._table

    def __getitem__(self, name: str) -> Callable[..., Task]:
        return self._load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


TASKS: Mapping[str, Callable[..., Task]] = _Registered()
"""Registered task factories by name (the trainer's own and every installed package's)."""


def task_factory(name: str) -> Callable[..., Task]:
    """The factory that `name` names; an unknown name says what exists, the closest name and the fix."""
    if plugins.is_code_reference(name):
        try:
            make = plugins.load_code(name, "task")
        except plugins.CodeError as e:
            raise TaskError(str(e)) from None
        if not callable(make):
            raise TaskError(f"task {name!r} is a {type(make).__name__}, not a function that returns a Task")
        return make
    if name in TASKS:
        return TASKS[name]
    close = difflib.get_close_matches(str(name), list(TASKS), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise TaskError(
        f"unknown task {name!r}; known: {', '.join(TASKS)}.{hint} Your own: 'module:function' or "
        f"'path/to/file.py:function' returning a Task, or an entry point of the group {ENTRY_POINT_GROUP!r}"
    )
