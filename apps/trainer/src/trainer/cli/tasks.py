"""`trainer tasks`: the built-in tasks; `--options` adds each task's `task.options.*` with its default."""

from __future__ import annotations

import argparse
import inspect

from trainer.tasks import FILE_TASKS, TASKS, file_task


def add_parser(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("tasks", help="built-in tasks")
    t.add_argument("--options", action="store_true", help="each task's options (task.options.NAME=VALUE) and defaults")


def options(name: str) -> list[tuple[str, str]]:
    """(option, default) of task `name`: its factory's keyword arguments (a file task's are file_task's)."""
    make = file_task if name in FILE_TASKS else TASKS[name]
    # a file task's None defaults are its kind's fields and lengths (GSM8K: question, answer, 256, 512)
    kind = {f: getattr(FILE_TASKS[name], f) for f in ("question_field", "answer_field", "max_prompt_tokens",
                                                        "max_new_tokens")} if name in FILE_TASKS else {}
    out = []
    for param in inspect.signature(make).parameters.values():
        if param.kind is not param.KEYWORD_ONLY:
            continue
        default = "required" if param.default is param.empty else repr(kind.get(param.name, param.default))
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
