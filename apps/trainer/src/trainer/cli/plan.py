"""`trainer plan`: the per-device memory of a run, and settings that make it fit."""

from __future__ import annotations

import argparse
import json
import sys

from rl_core import ConfigError

# The command's own modules are imported inside `run`, not at the top: the CLI imports every
# command module before parsing, and `trainer train` must join a multi-process run before
# anything else is imported (see trainer.cli and trainer.distributed).


def add_parser(sub: argparse._SubParsersAction) -> None:
    pl = sub.add_parser("plan", help="per-device memory of a run, from its compiled programs (no weights loaded)")
    pl.add_argument("--model", metavar="DIR", help="a Hugging Face folder (only config.json is read)")
    pl.add_argument("--preset", help="an rl_models preset instead (same as model.preset=NAME)")
    pl.add_argument("--algo", default="grpo", help="algorithm (default grpo)")
    pl.add_argument("--task", help="task name (same as task.name=NAME)")
    pl.add_argument("--data", metavar="FILE", help="data of a file task, as `trainer train` takes it "
                    "(same as task.options.data=FILE)")
    pl.add_argument("--config", help="YAML settings file")
    pl.add_argument("--devices", type=int, default=1, help="devices to plan for (simulated; default 1)")
    pl.add_argument("--platform", default="gpu", choices=("gpu", "tpu", "cpu"),
                    help="what the devices are (default gpu): picks model.attention=auto's kernel, the memory "
                         "the runtime reserves and the default --device-memory-gb")
    pl.add_argument("--device-memory-gb", type=float, default=None,
                    help="memory per device in GiB (default 80 on gpu; on tpu 15.75, a v5e chip's allocator limit "
                         "on every slice; 80 on cpu)")
    pl.add_argument("--memory-fraction", type=float, default=None,
                    help="share of it the runtime lets a run use (default: gpu XLA_CLIENT_MEM_FRACTION or 0.75, "
                         "JAX's preallocation; tpu 1, the limit being the allocator's; cpu 1)")
    pl.add_argument("--headroom", type=float, default=None,
                    help="share of the usable memory a plan keeps free before it says it fits (default 0.10; "
                         "0.05 for tpu where libtpu compiles the plan, as a run on the chip keeps)")
    pl.add_argument("--no-search", action="store_true",
                    help="when the run does not fit, do not search for settings that make it fit")
    pl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pl.add_argument("--mean-new-tokens", type=int, default=None,
                    help="mean completion length for the paged engine's KV in use (default max_new_tokens)")
    pl.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. training.mesh.tensor=2")


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: see the note above (train joins before any of this)
    from trainer.plan import memory_budget, plan, simulate_devices
    from trainer.plan.device_memory import COMPILER_HEADROOM, DEFAULT_HEADROOM, tpu_chip_memory_gb
    from trainer.plan.tpu_compile import libtpu_importable

    if args.devices < 1:
        raise ConfigError(f"--devices = {args.devices}: must be >= 1 (the devices to plan for)")
    # XLA:TPU's own figures need less room than another compiler's standing in for it
    headroom = args.headroom if args.headroom is not None else (
        COMPILER_HEADROOM if args.platform == "tpu" and libtpu_importable() else DEFAULT_HEADROOM)
    # a TPU slice's chips each offer their allocator's limit: what `trainer bench` on the chip plans against
    memory_gb = args.device_memory_gb
    if memory_gb is None and args.platform == "tpu":
        memory_gb = tpu_chip_memory_gb(args.devices)
    budget = memory_budget(args.platform, device_memory_gb=memory_gb, fraction=args.memory_fraction,
                           headroom=headroom)
    simulate_devices(args.devices)  # before anything starts JAX's backend
    # after simulate_devices: the search and the settings import JAX
    from trainer.plan.choice import Choice, NothingFits, pick_memory, plan_training_peak
    from trainer.plan.refusal import ProgramRefused
    from trainer.plan.search import search
    from trainer.plan.tpu_compile import calibrated, tpu_compiler
    from trainer.settings import build_settings

    shortcuts = [f"{k}={v}" for k, v in (("model.path", args.model), ("model.preset", args.preset),
                                          ("task.name", args.task), ("task.options.data", args.data)) if v is not None]

    def settings_with(extra):
        return build_settings(algo=args.algo, config_file=args.config, overrides=[*shortcuts, *args.overrides, *extra])

    programs: dict = {}  # compiled once, shared by the candidates of the search
    # on TPU: XLA:TPU ahead of time where libtpu is importable, else XLA:CPU calibrated (trainer.plan.tpu_compile)
    compiler = tpu_compiler(args.devices) if args.platform == "tpu" else None
    options = compiler.plan_options() if compiler else {}

    def plan_of(settings):
        planned = plan(settings, budget, mean_new_tokens=args.mean_new_tokens, compiled_programs=programs, **options)
        return calibrated(planned, compiler.calibration) if compiler and compiler.calibration else planned

    note = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else (lambda line: print(line, flush=True))
    if compiler:
        note(f"tpu: {compiler.description}")
    settings = settings_with(())
    picked = ()
    try:
        # model.remat and training.micro_batch_size left at auto: what a run on this device would pick
        settings, choice = pick_memory(settings, budget.limit_bytes, lambda s: plan_training_peak(plan_of(s)),
                                       args.platform, log=note, detail=note)
        picked = choice.overrides() if choice.auto else ()
    except NothingFits as e:
        note(str(e))
        picked = Choice(e.last, "", ("model.remat",)).overrides()
        settings = settings_with(picked)
    try:
        result = plan_of(settings)
    except ProgramRefused as e:  # compiled for a TPU, whose compiler refuses what does not fit
        print(json.dumps(e.to_dict(), indent=2) if args.json else e.verdict(), flush=True)
        return 1
    if not args.json:
        print(result.table(), flush=True)
    fit = None
    if not result.fits and not args.no_search:
        log = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else (
            lambda line: print(line, flush=True))
        log("searching for settings that fit, cheapest first:")
        fit = search(result, settings, lambda extra: settings_with((*picked, *extra)), plan_of, log=log)
        if not args.json:
            print(f"fits with: {' '.join(fit.overrides)}" if fit else
                  "nothing searched fits (attention, remat, micro-batch size, an expert axis, rollout engine and slots)")
    if args.json:
        found = None if fit is None else {"overrides": list(fit.overrides), "plan": fit.plan.to_dict()}
        out = result.to_dict() | {"memory_settings": list(picked), "fit": found}
        print(json.dumps(out, indent=2))
    return 0
