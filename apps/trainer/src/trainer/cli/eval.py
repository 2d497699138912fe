"""`trainer eval`: held-out greedy accuracy and pass@k of a run; with `--data FILE`, a benchmark file's
accuracy, pass@k and maj@k with intervals, per data_source, of a run or a model folder."""

from __future__ import annotations

import argparse
import json

from trainer.cli.common import SETTINGS_HINT, location

# The command's own modules are imported inside `run`, not at the top: the CLI imports every
# command module before parsing, and `trainer train` must join a multi-process run before
# anything else is imported (see trainer.cli and trainer.distributed).


def add_parser(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("eval", help="held-out accuracy (greedy) and pass@k of a run, or a benchmark file's (--data)",
                       epilog=SETTINGS_HINT)
    e.add_argument("--run", type=location, help="run folder written by `trainer train` (a path or a URL)")
    e.add_argument("--data", metavar="FILE", help="a benchmark file (any row shape, docs/bring-your-own-task.md): "
                   "accuracy, pass@k and maj@k with 95%% intervals, per data_source; saved beside the run as eval/<stem>.json")
    e.add_argument("--model", metavar="DIR", help="with --data: a Hugging Face folder to evaluate instead of a run")
    e.add_argument("--reward", help="with --data: the reward that says what is correct (a registered name, "
                   "module:function or file.py:function; default: the run's, else chosen from the references)")
    e.add_argument("--output", metavar="FILE", help="with --data: where to write the JSON results (default: "
                   "<run>/eval/<stem>.json; a model folder's are only printed)")
    e.add_argument("--k", type=int, default=None, help="k of pass@k (default: the run's)")
    e.add_argument("--samples", type=int, default=None, help="n samples per prompt (default: the run's)")


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: see the note above (train joins before any of this)
    from pathlib import Path

    from rl_core import ConfigError

    from trainer.run.saved_run import evaluate_data, evaluate_run, results_path

    if args.data is None:
        if args.run is None or args.model or args.reward or args.output:
            raise ConfigError("trainer eval needs --run DIR (held-out split), or --data FILE with --run DIR or --model DIR")
        print(json.dumps(evaluate_run(args.run, k=args.k, samples=args.samples), indent=2))
        return 0
    k = 4 if args.k is None else args.k
    result = evaluate_data(args.data, run_dir=args.run, model_dir=args.model, k=k,
                           samples=max(k, 8) if args.samples is None else args.samples, reward=args.reward)
    text = json.dumps(result, indent=2)
    out = Path(args.output) if args.output else (results_path(Path(args.run), args.data) if args.run else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    print(text)
    return 0
