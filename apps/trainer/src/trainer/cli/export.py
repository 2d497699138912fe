"""`trainer export`: a run's policy as a Hugging Face folder."""

from __future__ import annotations

import argparse
import json

from trainer.cli.common import SETTINGS_HINT, location

# The command's own modules are imported inside `run`, not at the top: the CLI imports every
# command module before parsing, and `trainer train` must join a multi-process run before
# anything else is imported (see trainer.cli and trainer.distributed).


def add_parser(sub: argparse._SubParsersAction) -> None:
    o = sub.add_parser(
        "export", help="write a run's policy as a Hugging Face folder (transformers, vLLM)", epilog=SETTINGS_HINT
    )
    o.add_argument("--run", type=location, required=True, help="run folder written by `trainer train` (a path or a URL)")
    o.add_argument("--out", type=location, required=True, metavar="HF_DIR", help="folder to write (a path or a URL)")
    o.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    o.add_argument("--adapter", action="store_true",
                   help="a LoRA run's adapters alone, in the PEFT layout (default: the merged model)")
    o.add_argument("--overwrite", action="store_true", help="replace a non-empty --out folder as a whole")


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: see the note above (train joins before any of this)
    from trainer.export import export_run

    print(json.dumps(export_run(args.run, args.out, step=args.step, adapter=args.adapter, overwrite=args.overwrite),
                     indent=2))
    return 0
