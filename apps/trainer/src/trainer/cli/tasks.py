"""`trainer tasks`: the registered tasks (the built-in ones and every installed package's entry point of the
group `trainer.tasks`); `--options` adds each task's `task.options.*` with its default."""

from __future__ import annotations

import argparse
import inspect

from trainer.tasks import TASKS


def add_parser(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("tasks", help="registered tasks (built-in and installed packages')")
    t.add_argument("--options", action="store_true", help="each task's options (task.options.NAME=VALUE) and defaults")


def options(name: str) -> list[tuple[str, str]]:
    """(option, default) of task `name`: its factory's keyword arguments."""
    out = []
    for param in inspect.signature(TASKS[name]).parameters.values():
        if param.kind is not param.KEYWORD_ONLY:
            continue
        default = "required" if param.default is param.empty else repr(param.default)
        out.append((param.name, default))
    return out


def run(args: argparse.Namespace) -> int:
    for name, make in TASKS.items():
        try:
            task = make()
        except ValueError as e:  # an optional library not installed
            print(f"{name:12s} {e}")
            continue
        except TypeError:  # a file-backed task: it needs options.data
            doc = (make.__doc__ or "reads task.options.data").strip().splitlines()[0]
            print(f"{name:12s} from a local file (task.options.data=FILE)  {doc}")
        else:
            print(f"{name:12s} {len(task.train)} train / {len(task.heldout)} held-out  {task.description}")
        if args.options:
            for option, default in options(name):
                print(f"    task.options.{option} = {default}")
    return 0
