"""`trainer samples RUN`: the samples of a run (samples.jsonl) that match filters, printed or written."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainer.cli.common import location

# The command's own modules are imported inside `run`, not at the top: the CLI imports every
# command module before parsing, and `trainer train` must join a multi-process run before
# anything else is imported (see trainer.cli and trainer.distributed).


def add_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("samples", help="filter a run's samples by step, reward, length or text")
    s.add_argument("run", type=location, metavar="RUN", help="run folder, a path or a URL (finished or running)")
    s.add_argument("--step", action="append", default=[], metavar="N|A:B", help="a step, or a range A:B, A: or :B (repeatable)")
    s.add_argument("--min-reward", type=float, metavar="R", help="total reward >= R")
    s.add_argument("--max-reward", type=float, metavar="R", help="total reward <= R")
    s.add_argument("--min-length", type=int, metavar="T", help="completion tokens >= T")
    s.add_argument("--max-length", type=int, metavar="T", help="completion tokens <= T")
    s.add_argument("--contains", metavar="TEXT",
                   help="TEXT in the prompt followed by its completion, e.g. =12 (case-insensitive)")
    s.add_argument("--regex", metavar="PATTERN", help="a regular expression found in the completion")
    s.add_argument("--limit", type=int, default=20, metavar="N", help="print the first N matches as a table (default 20)")
    s.add_argument("--json", action="store_true", help="print every match as a JSON line instead of a table")
    s.add_argument("--output", type=Path, metavar="FILE", help="write every match to FILE as JSONL instead")


def run(args: argparse.Namespace) -> int:
    from rl_core import ConfigError

    from trainer.show import SampleFilter, parse_steps, show_samples

    if args.limit < 1:
        raise ConfigError(f"--limit {args.limit}: must be >= 1")
    where = SampleFilter(
        steps=parse_steps(args.step), min_reward=args.min_reward, max_reward=args.max_reward,
        min_length=args.min_length, max_length=args.max_length, contains=args.contains, regex=args.regex,
    )
    show_samples(args.run, where, limit=args.limit, output=args.output, as_json=args.json)
    return 0
