"""`trainer train`: one run into a run folder; `--resume DIR` continues it exactly."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rl_core import ConfigError

from trainer.cli.common import DEFAULT_COMPARE_DIR, SETTINGS_HINT, location

# The command's own modules are imported inside `run`, not at the top: the CLI imports every
# command module before parsing, and `trainer train` must join a multi-process run before
# anything else is imported (see trainer.cli and trainer.distributed).


def add_parser(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("train", help="train one algorithm variant", epilog=SETTINGS_HINT)
    t.add_argument("--algo", help="algorithm name (see `trainer algos`)")
    t.add_argument("--config", help="YAML settings file")
    t.add_argument("--output", type=location, help="run folder, a path or a URL such as gs://bucket/runs/x "
                   "(default runs/<algo>-<time>)")
    t.add_argument("--resume", type=location, metavar="DIR", help="continue the run in DIR exactly (add training.num_steps=N to extend it)")
    t.add_argument("--overwrite", action="store_true", help="replace the run (or config.yaml) already in --output")
    t.add_argument("--model", metavar="DIR", help="Hugging Face folder, a path or a URL (same as model.path=DIR)")
    t.add_argument("--task", help="task name (same as task.name=NAME)")
    t.add_argument("--data", metavar="FILE", help="rows of your task: JSONL, JSON array, Parquet, a folder of Parquet shards, a datasets.save_to_disk folder or module:function; any row shape, no --task needed (same as task.options.data=FILE; docs/bring-your-own-task.md)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--base-from", type=Path, default=DEFAULT_COMPARE_DIR, metavar="DIR",
                   help=f"reuse an identical cached base policy (same warm start, model, task and device layout) "
                        f"from DIR, copied into the run folder (default {DEFAULT_COMPARE_DIR}, where `trainer compare` "
                        "keeps its)")
    t.add_argument("--coordinator", metavar="HOST:PORT", help="multi-process run: process 0's address (or JAX_COORDINATOR_ADDRESS)")
    t.add_argument("--num-processes", type=int, metavar="N", help="multi-process run: how many processes (or JAX_NUM_PROCESSES)")
    t.add_argument("--process-id", type=int, metavar="I", help="multi-process run: this process, 0..N-1 (or JAX_PROCESS_ID)")
    t.add_argument("--distributed", action="store_true", help="multi-process run on a cluster JAX detects (TPU, SLURM, Open MPI, Kubernetes)")
    t.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. training.num_steps=50")


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: see the note above (train joins before any of this)
    from trainer import distributed

    # first: the settings' checks count the devices of every process
    distributed.join(distributed.launch_from(args.coordinator, args.num_processes, args.process_id, args.distributed))
    # the rest only after the join
    from trainer.judge.reward import judge_rewards
    from trainer.run import settings_of_run, train_run
    from trainer.run.teacher import load_teacher
    from trainer.settings import build_settings, parse_overrides

    if args.resume:
        settings = settings_of_run(args.resume)
        steps = parse_overrides(args.overrides).get("training", {}).get("num_steps") if args.overrides else None
        if args.algo or args.config or args.model or args.task or args.data or args.overwrite or (
            args.overrides and (len(args.overrides) != 1 or steps is None)
        ):
            raise ConfigError(
                "--resume continues a run with its saved settings; drop --algo, --config, --overwrite and "
                "overrides other than training.num_steps=N (which extends the run)"
            )
        if steps is not None:
            settings = settings_of_run(args.resume, args.overrides)
        run_dir = args.resume
    else:
        if not args.algo:
            raise ConfigError("train needs --algo NAME (see `trainer algos`) or --resume DIR")
        shortcuts = [
            f"{key}={value}"
            for key, value in (("model.path", args.model), ("task.name", args.task), ("task.options.data", args.data))
            if value is not None
        ]
        settings = build_settings(algo=args.algo, config_file=args.config, overrides=[*shortcuts, *args.overrides])
        run_dir = args.output or Path("runs") / f"{settings.algo}-{time.strftime('%Y%m%d-%H%M%S')}"
    summary = train_run(
        settings, run_dir, resume=bool(args.resume), progress=not args.no_progress, overwrite=args.overwrite,
        reuse_base_from=[args.base_from],
        rewards=lambda task, cache: judge_rewards(settings, task, cache_dir=cache),
        teacher=load_teacher,  # a distilling run's (algorithm.teacher)
    )
    from rl_core.runtime import multihost

    if multihost.is_primary():  # process 0 speaks for a multi-process run
        print(json.dumps({k: summary[k] for k in ("algo", "steps", "before", "after")}, indent=2))
    return 0
