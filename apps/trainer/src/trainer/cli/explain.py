"""`trainer explain`: one group scored by hand under every installed algorithm."""

from __future__ import annotations

import argparse
import sys

# The command's own modules are imported inside `run`, not at the top: the CLI imports every
# command module before parsing, and `trainer train` must join a multi-process run before
# anything else is imported (see trainer.cli and trainer.distributed).


def add_parser(sub: argparse._SubParsersAction) -> None:
    x = sub.add_parser("explain", help="score one group by hand under every installed algorithm")
    x.add_argument("--rewards", required=True, help="comma-separated rewards of one group, e.g. 1,0,0,1")
    x.add_argument("--ratios", help="comma-separated importance ratios (default all 1)")
    x.add_argument("--lengths", help="comma-separated completion lengths in tokens (default all 4)")
    x.add_argument("--kl", type=float, default=0.0, help="per-token KL estimate, to show the KL term")


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: see the note above (train joins before any of this)
    from trainer.explain import ExplainInputError, explain

    try:
        text = explain(rewards=args.rewards, ratios=args.ratios, lengths=args.lengths, kl=args.kl)
    except ExplainInputError as e:
        print(f"trainer explain: error: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0
