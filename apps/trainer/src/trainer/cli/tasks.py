"""`trainer tasks`: the built-in tasks."""

from __future__ import annotations

import argparse

from trainer.tasks import TASKS


def add_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("tasks", help="built-in tasks")


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
            continue
        print(f"{name:12s} {len(task.train)} train / {len(task.heldout)} held-out  {task.description}")
    return 0
