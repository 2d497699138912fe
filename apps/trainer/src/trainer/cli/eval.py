"""`trainer eval`: held-out greedy accuracy and pass@k of a run."""

from __future__ import annotations

import argparse
import json

from trainer.cli.common import SETTINGS_HINT, location

# The command's own modules are imported inside `run`, not at the top: the CLI imports every
# command module before parsing, and `trainer train` must join a multi-process run before
# anything else is imported (see trainer.cli and trainer.distributed).


def add_parser(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("eval", help="held-out accuracy (greedy) and pass@k of a run", epilog=SETTINGS_HINT)
    e.add_argument("--run", type=location, required=True, help="run folder written by `trainer train` (a path or a URL)")
    e.add_argument("--k", type=int, default=None, help="k of pass@k (default: the run's)")
    e.add_argument("--samples", type=int, default=None, help="n samples per prompt (default: the run's)")


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: see the note above (train joins before any of this)
    from trainer.run.saved_run import evaluate_run

    print(json.dumps(evaluate_run(args.run, k=args.k, samples=args.samples), indent=2))
    return 0
