"""`trainer compare`: variants x seeds from one base policy, and their report."""

from __future__ import annotations

import argparse

from rl_core import ConfigError
from rl_core.run import is_url

from trainer.cli.common import DEFAULT_COMPARE_DIR, SETTINGS_HINT, location

# The command's own modules are imported inside `run`, not at the top: the CLI imports every
# command module before parsing, and `trainer train` must join a multi-process run before
# anything else is imported (see trainer.cli and trainer.distributed).


def add_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("compare", help="run variants from the same base policy and report", epilog=SETTINGS_HINT)
    c.add_argument("algos", nargs="*", metavar="ALGO|key=value", help="algorithms (default: every installed one) and dotted overrides")
    c.add_argument("--config", help="YAML settings file applied to every variant")
    c.add_argument("--output", type=location, default=DEFAULT_COMPARE_DIR, help=f"report folder (default {DEFAULT_COMPARE_DIR})")
    c.add_argument("--data", metavar="FILE", help="rows of your task, any shape (same as task.options.data=FILE; "
                   "docs/bring-your-own-task.md)")
    c.add_argument("--model", metavar="DIR", help="Hugging Face folder every variant starts from (same as model.path=DIR)")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="key=value", help="dotted override (repeatable)")
    c.add_argument("--seeds", type=int, metavar="N", help="seeds per variant (default 3): mean and 95%% CI")
    c.add_argument("--overwrite", action="store_true", help="replace an earlier comparison in the --output folder")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: see the note above (train joins before any of this)
    from trainer.compare import compare

    if is_url(args.output):
        raise ConfigError(
            f"compare --output {args.output}: a comparison's folder is local (a URL is not supported for it yet); "
            "give a local folder and copy it afterwards, or train each variant with `trainer train --output URL`"
        )
    algos = [a for a in args.algos if "=" not in a]
    shortcuts = [f"{key}={value}" for key, value in (("task.options.data", args.data), ("model.path", args.model))
                 if value is not None]
    overrides = shortcuts + [a for a in args.algos if "=" in a] + args.overrides
    table, _ = compare(
        algos,
        output=args.output,
        config_file=args.config,
        overrides=overrides,
        seeds=args.seeds,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    print(table)
    return 0
