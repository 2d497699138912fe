"""`trainer config`: every setting, with its type, default and description."""

from __future__ import annotations

import argparse

# The command's own modules are imported inside `run`, not at the top: the CLI imports every
# command module before parsing, and `trainer train` must join a multi-process run before
# anything else is imported (see trainer.cli and trainer.distributed).


def add_parser(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("config", help="every setting: key, type, default and description")
    g.add_argument("--algo", default="grpo", help="whose algorithm.* fields to list (default grpo)")
    g.add_argument("overrides", nargs="*", metavar="key=value",
                   help="settings to resolve the listing with, as `trainer train` takes them")


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: see the note above (train joins before any of this)
    from trainer.settings import describe

    print(describe(args.algo, args.overrides))
    return 0
