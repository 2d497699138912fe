"""The `trainer` command line: train, show, samples, compare, eval, export, convert, bench, explain, config,
algos, tasks, serve."""

from __future__ import annotations

import argparse
import signal
import sys

from rewards import RewardError
from rl_core.runtime import keep_freed_memory, unroll_threefry_on_cpu
from rl_core import ConfigError, NonFiniteUpdateError, RegistryError
from rl_core.run import RunFileError, StorageError
from rl_models.hf import HFFolderError

from trainer.cli import algos, bench, compare, config, convert, explain, export, plan, samples, serve, show, tasks, train
from trainer.cli import eval as evaluate
from trainer.cli.common import SETTINGS_HINT
from trainer.signals import RunInterrupted
from trainer.user_cache import use_compilation_cache
from trainer.tasks import DataError

# each command: its module's add_parser (its arguments) and run (its handler), in --help's order
COMMAND_MODULES = {
    "train": train, "show": show, "samples": samples, "compare": compare, "eval": evaluate, "export": export, "convert": convert, "bench": bench,
    "plan": plan, "explain": explain, "config": config, "algos": algos, "tasks": tasks, "serve": serve,
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trainer", description="RL for language models: GRPO and its variants on JAX.", epilog=SETTINGS_HINT
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES.values():
        module.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    # argparse fills a `nargs="*"` positional from one run of arguments only, so in
    # `compare grpo dapo --output DIR a.b=1` the overrides after the option are left over
    if extra and args.command in ("train", "compare", "plan", "bench") and not any(x.startswith("-") for x in extra):
        if args.command in ("train", "plan", "bench"):
            args.overrides += extra
        else:
            args.algos += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        keep_freed_memory()  # XLA:CPU reuses its buffers instead of page-faulting fresh ones every step
        unroll_threefry_on_cpu()  # random draws without a loop of tiny operations (the same bits)
        use_compilation_cache()  # later runs, seeds and resumes load their programs instead of compiling
        return COMMANDS[args.command](args)
    except (
        ConfigError, RegistryError, DataError, RewardError, NonFiniteUpdateError, OSError, HFFolderError, RunFileError,
        StorageError,
    ) as e:
        print(f"trainer {args.command}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except RunInterrupted as e:
        print(f"trainer {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:  # Ctrl-C before training (loading, warm start): its work so far is kept
        print(f"trainer {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


def one_line(error: Exception) -> str:
    """The message of `error` on one line; an operating-system error as `path: what went wrong`
    (a read-only folder, a name too long, a full disk), not Python's `[Errno 28] ...` repr."""
    if isinstance(error, OSError) and error.strerror and len(error.args) >= 2:
        where = f"{error.filename}: " if error.filename is not None else ""
        also = f" (and {error.filename2})" if error.filename2 is not None else ""
        return f"{where}{error.strerror}{also}"
    return str(error)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trainer")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


COMMANDS = {name: module.run for name, module in COMMAND_MODULES.items()}
