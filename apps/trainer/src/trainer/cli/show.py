"""`trainer show RUN`: a run's summary on the terminal and its curves as PNG files."""

from __future__ import annotations

import argparse

from trainer.cli.common import location

# The command's own modules are imported inside `run`, not at the top: the CLI imports every
# command module before parsing, and `trainer train` must join a multi-process run before
# anything else is imported (see trainer.cli and trainer.distributed).


def add_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("show", help="a run's settings, curves (PNG), reward audit warnings and samples")
    s.add_argument("run", type=location, metavar="RUN", help="run folder, a path or a URL (finished or running)")
    s.add_argument("--step", action="append", default=[], metavar="N|A:B",
                   help="steps whose best and worst samples to print (repeatable; default the first and the last)")
    s.add_argument("--count", type=int, default=2, metavar="K", help="best and worst samples per step (default 2)")
    s.add_argument("--no-plots", action="store_true", help="the terminal summary alone, no PNG files")


def run(args: argparse.Namespace) -> int:
    from rl_core import ConfigError

    from trainer.show import parse_steps, show_run

    if args.count < 1:
        raise ConfigError(f"--count {args.count}: must be >= 1")
    show_run(args.run, steps=parse_steps(args.step), count=args.count, plots=not args.no_plots)
    return 0
