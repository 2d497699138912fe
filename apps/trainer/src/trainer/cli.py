"""The `trainer` command line: train, compare, eval, export, bench, explain, config, algos, tasks."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from rewards import RewardError
from rl_core.compiles import use_persistent_cache
from rl_core.config import ConfigError
from rl_core.cpu_random import unroll_threefry_on_cpu
from rl_core.host_memory import keep_freed_memory
from rl_core.learner import NonFiniteUpdateError
from rl_core.registry import RegistryError
from rl_core.files import RunFileError
from rl_core.storage import StorageError, is_url
from rl_models.hf import HFFolderError

from trainer.tasks import DataError
from trainer.signals import RunInterrupted

DEFAULT_COMPARE_DIR = Path("runs/compare")
def location(text: str) -> Path | str:
    """A folder argument: a local path, or a URL kept as written (gs://bucket/run; a Path would fold its //)."""
    return text if is_url(text) else Path(text)


SETTINGS_HINT = "settings: `trainer config [--algo NAME]` lists every key=value setting with its type, default and description"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trainer", description="RL for language models: GRPO and its variants on JAX.", epilog=SETTINGS_HINT
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train one algorithm variant", epilog=SETTINGS_HINT)
    t.add_argument("--algo", help="algorithm name (see `trainer algos`)")
    t.add_argument("--config", help="YAML settings file")
    t.add_argument("--output", type=location, help="run folder, a path or a URL such as gs://bucket/runs/x "
                   "(default runs/<algo>-<time>)")
    t.add_argument("--resume", type=location, metavar="DIR", help="continue the run in DIR exactly (add training.num_steps=N to extend it)")
    t.add_argument("--overwrite", action="store_true", help="replace the run (or config.yaml) already in --output")
    t.add_argument("--model", metavar="DIR", help="Hugging Face folder, a path or a URL (same as model.path=DIR)")
    t.add_argument("--task", help="task name (same as task.name=NAME)")
    t.add_argument("--data", metavar="FILE", help="data of a file task: JSONL, JSON array, Parquet, a folder of Parquet shards or a datasets.save_to_disk folder (same as task.options.data=FILE)")
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

    c = sub.add_parser("compare", help="run variants from the same base policy and report", epilog=SETTINGS_HINT)
    c.add_argument("algos", nargs="*", metavar="ALGO|key=value", help="algorithms (default: every installed one) and dotted overrides")
    c.add_argument("--config", help="YAML settings file applied to every variant")
    c.add_argument("--output", type=location, default=DEFAULT_COMPARE_DIR, help=f"report folder (default {DEFAULT_COMPARE_DIR})")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="key=value", help="dotted override (repeatable)")
    c.add_argument("--seeds", type=int, metavar="N", help="seeds per variant (default 3): mean and 95%% CI")
    c.add_argument("--overwrite", action="store_true", help="replace an earlier comparison in the --output folder")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")

    e = sub.add_parser("eval", help="held-out accuracy (greedy) and pass@k of a run", epilog=SETTINGS_HINT)
    e.add_argument("--run", type=location, required=True, help="run folder written by `trainer train` (a path or a URL)")
    e.add_argument("--k", type=int, default=None, help="k of pass@k (default: the run's)")
    e.add_argument("--samples", type=int, default=None, help="n samples per prompt (default: the run's)")

    o = sub.add_parser(
        "export", help="write a run's policy as a Hugging Face folder (transformers, vLLM)", epilog=SETTINGS_HINT
    )
    o.add_argument("--run", type=location, required=True, help="run folder written by `trainer train` (a path or a URL)")
    o.add_argument("--out", type=location, required=True, metavar="HF_DIR", help="folder to write (a path or a URL)")
    o.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    o.add_argument("--adapter", action="store_true",
                   help="a LoRA run's adapters alone, in the PEFT layout (default: the merged model)")
    o.add_argument("--overwrite", action="store_true", help="replace a non-empty --out folder as a whole")

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
    b.add_argument("overrides", nargs="*", metavar="key=value",
                   help="model settings, e.g. model.lora.rank=8 model.quantize=int8 (a LoRA run)")

    pl = sub.add_parser("plan", help="per-device memory of a run, from its compiled programs (no weights loaded)")
    pl.add_argument("--model", metavar="DIR", help="a Hugging Face folder (only config.json is read)")
    pl.add_argument("--preset", help="an rl_models preset instead (same as model.preset=NAME)")
    pl.add_argument("--algo", default="grpo", help="algorithm (default grpo)")
    pl.add_argument("--config", help="YAML settings file")
    pl.add_argument("--devices", type=int, default=1, help="devices to plan for (simulated; default 1)")
    pl.add_argument("--platform", default="gpu", choices=("gpu", "tpu", "cpu"),
                    help="what the devices are (default gpu): picks model.attention=auto's kernel, the memory "
                         "the runtime reserves and the default --device-memory-gb")
    pl.add_argument("--device-memory-gb", type=float, default=None,
                    help="memory per device in GiB (default 80 on gpu, 16 on tpu: a v5e chip, 80 on cpu)")
    pl.add_argument("--memory-fraction", type=float, default=None,
                    help="share of it the runtime lets a run use (default: gpu XLA_CLIENT_MEM_FRACTION or 0.75, "
                         "JAX's preallocation; tpu 0.97; cpu 1)")
    pl.add_argument("--headroom", type=float, default=0.10,
                    help="share of the usable memory a plan keeps free before it says it fits (default 0.10)")
    pl.add_argument("--no-search", action="store_true",
                    help="when the run does not fit, do not search for settings that make it fit")
    pl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pl.add_argument("--mean-new-tokens", type=int, default=None,
                    help="mean completion length for the paged engine's KV in use (default max_new_tokens)")
    pl.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. training.mesh.tensor=2")

    x = sub.add_parser("explain", help="score one group by hand under every installed algorithm")
    x.add_argument("--rewards", required=True, help="comma-separated rewards of one group, e.g. 1,0,0,1")
    x.add_argument("--ratios", help="comma-separated importance ratios (default all 1)")
    x.add_argument("--lengths", help="comma-separated completion lengths in tokens (default all 4)")
    x.add_argument("--kl", type=float, default=0.0, help="per-token KL estimate, to show the KL term")

    g = sub.add_parser("config", help="every setting: key, type, default and description")
    g.add_argument("--algo", default="grpo", help="whose algorithm.* fields to list (default grpo)")

    sub.add_parser("algos", help="installed algorithms")
    sub.add_parser("tasks", help="built-in tasks")
    return p


def use_compilation_cache() -> None:
    """Keep compiled programs in rl-variants/jax in the user's cache folder.

    A JAX_COMPILATION_CACHE_DIR in the environment is the user's own JAX setup
    (JAX reads it, with its other JAX_* settings), and is left as it is;
    JAX_ENABLE_COMPILATION_CACHE=false turns either off.
    """
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        use_persistent_cache(Path(base) / "rl-variants" / "jax")


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


def cmd_train(args: argparse.Namespace) -> int:
    from trainer import distributed

    # first: the settings' checks count the devices of every process
    distributed.join(distributed.launch_from(args.coordinator, args.num_processes, args.process_id, args.distributed))
    from trainer.run import settings_of_run, train_run
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
    )
    from rl_core import multihost

    if multihost.is_primary():  # process 0 speaks for a multi-process run
        print(json.dumps({k: summary[k] for k in ("algo", "steps", "before", "after")}, indent=2))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from trainer.compare import compare

    if is_url(args.output):
        raise ConfigError(
            f"compare --output {args.output}: a comparison's folder is local (a URL is not supported for it yet); "
            "give a local folder and copy it afterwards, or train each variant with `trainer train --output URL`"
        )
    algos = [a for a in args.algos if "=" not in a]
    overrides = [a for a in args.algos if "=" in a] + args.overrides
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


def cmd_eval(args: argparse.Namespace) -> int:
    from trainer.evaluate.saved_run import evaluate_run

    print(json.dumps(evaluate_run(args.run, k=args.k, samples=args.samples), indent=2))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from trainer.export import export_run

    print(json.dumps(export_run(args.run, args.out, step=args.step, adapter=args.adapter, overwrite=args.overwrite),
                     indent=2))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from trainer.bench import run_bench
    from trainer.bench_baseline import compare, differences, load_baseline, print_comparison

    baseline = load_baseline(args.baseline) if args.baseline else None  # a bad file fails before the run
    results = run_bench(preset=args.preset, steps=args.steps, output=args.output, algo=args.algo, model=args.model,
                        overrides=args.overrides)
    if baseline is None:
        return 0
    rows = compare(results, baseline)
    print_comparison(rows, args.baseline, differences(results, baseline))
    return 1 if any(r.flagged for r in rows) else 0


def cmd_plan(args: argparse.Namespace) -> int:
    from trainer.plan import memory_budget, plan, simulate_devices

    if args.devices < 1:
        raise ConfigError(f"--devices = {args.devices}: must be >= 1 (the devices to plan for)")
    budget = memory_budget(args.platform, device_memory_gb=args.device_memory_gb, fraction=args.memory_fraction,
                           headroom=args.headroom)
    simulate_devices(args.devices)  # before anything starts JAX's backend
    from trainer.plan.search import search
    from trainer.settings import build_settings

    shortcuts = [f"{k}={v}" for k, v in (("model.path", args.model), ("model.preset", args.preset)) if v is not None]

    def settings_with(extra):
        return build_settings(algo=args.algo, config_file=args.config, overrides=[*shortcuts, *args.overrides, *extra])

    programs: dict = {}  # compiled once, shared by the candidates of the search

    def plan_of(settings):
        return plan(settings, budget, mean_new_tokens=args.mean_new_tokens, compiled_programs=programs)

    settings = settings_with(())
    result = plan_of(settings)
    if not args.json:
        print(result.table(), flush=True)
    fit = None
    if not result.fits and not args.no_search:
        log = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else (
            lambda line: print(line, flush=True))
        log("searching for settings that fit, cheapest first:")
        fit = search(result, settings, settings_with, plan_of, log=log)
        if not args.json:
            print(f"fits with: {' '.join(fit.overrides)}" if fit else
                  "nothing searched fits (attention, remat, micro-batch size, rollout engine and slots)")
    if args.json:
        out = result.to_dict() | {"fit": None if fit is None else {"overrides": list(fit.overrides),
                                                                     "plan": fit.plan.to_dict()}}
        print(json.dumps(out, indent=2))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from trainer.explain import ExplainInputError, explain

    try:
        text = explain(rewards=args.rewards, ratios=args.ratios, lengths=args.lengths, kl=args.kl)
    except ExplainInputError as e:
        print(f"trainer explain: error: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from trainer.settings import describe

    print(describe(args.algo))
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trainer")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def cmd_algos(args: argparse.Namespace) -> int:
    from rl_core import registry

    names = registry.registry.names("algorithm")
    providers = {name: registry.registry.provider("algorithm", name) for name in names}
    width = max(map(len, names), default=0), max(map(len, providers.values()), default=0)
    for name in names:
        algo = registry.get_algorithm(name)
        doc = next(iter((algo.learner.__doc__ or algo.config.__doc__ or "").strip().splitlines()), "")
        print(f"{name:{width[0]}s} {providers[name]:{width[1]}s} {doc}")
    for why in registry.registry.load_failures.values():
        print(f"(failed to load: {why})")
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    from trainer.tasks import TASKS

    for name, make in TASKS.items():
        try:
            task = make()
        except TypeError:  # a file-backed task: it needs options.data
            doc = (make.__doc__ or "reads task.options.data").strip().splitlines()[0]
            print(f"{name:12s} from a local file (task.options.data=FILE)  {doc}")
            continue
        print(f"{name:12s} {len(task.train)} train / {len(task.heldout)} held-out  {task.description}")
    return 0


COMMANDS = {
    "train": cmd_train,
    "compare": cmd_compare,
    "eval": cmd_eval,
    "export": cmd_export,
    "bench": cmd_bench,
    "plan": cmd_plan,
    "explain": cmd_explain,
    "config": cmd_config,
    "algos": cmd_algos,
    "tasks": cmd_tasks,
}

if __name__ == "__main__":
    sys.exit(main())
