"""`trainer bench`: rollout and train-step speed, compile count and MFU; `--baseline` for before/after."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trainer.cli.common import SETTINGS_HINT

# The command's own modules are imported inside `run`, not at the top: the CLI imports every
# command module before parsing, and `trainer train` must join a multi-process run before
# anything else is imported (see trainer.cli and trainer.distributed).


def add_parser(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "bench", help="rollout and train-step speed, compile count and model-FLOPs utilisation", epilog=SETTINGS_HINT
    )
    b.add_argument("--preset", default="tiny-qwen2", help="benchmark preset (default tiny-qwen2)")
    b.add_argument("--steps", type=int, default=10, help="timed steps after warm-up")
    b.add_argument("--output", type=Path, default=Path("runs/bench.json"), help="JSON output file")
    b.add_argument("--algo", default="grpo", help="algorithm to benchmark (default grpo)")
    b.add_argument("--model", metavar="DIR", help="a local Hugging Face folder instead of the preset's model")
    b.add_argument("--baseline", type=Path, metavar="FILE",
                   help="a saved bench JSON: print each phase's ratio to it; exit 1 when one is >10%% slower")
    b.add_argument("--memory-gb", type=float, metavar="N",
                   help="GiB per device the benchmark may use (default: what the device or host has free)")
    b.add_argument("--profile", type=Path, metavar="DIR",
                   help="write a jax.profiler trace of the timed steps to DIR and print its costliest ops")
    b.add_argument("overrides", nargs="*", metavar="key=value",
                   help="model settings, e.g. model.lora.rank=8 model.quantize=int8 (a LoRA run)")


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: see the note above (train joins before any of this)
    from trainer.bench.measure import run_bench
    from trainer.bench.baseline import compare, differences, load_baseline, print_comparison

    baseline = load_baseline(args.baseline) if args.baseline else None  # a bad file fails before the run
    results = run_bench(preset=args.preset, steps=args.steps, output=args.output, algo=args.algo, model=args.model,
                        overrides=args.overrides, memory_gb=args.memory_gb, profile=args.profile)
    if args.profile:
        from trainer.bench.trace import summarise

        found = summarise(args.profile)
        print(f"profile of the timed steps: {found['trace']}")
        print("\n".join(found["lines"]))
        if args.output:  # beside the results: the ops a later look at the numbers needs
            args.output.with_suffix(".profile.json").write_text(json.dumps(found, indent=2) + "\n")
    if baseline is None:
        return 0
    rows = compare(results, baseline)
    print_comparison(rows, args.baseline, differences(results, baseline))
    return 1 if any(r.flagged for r in rows) else 0
