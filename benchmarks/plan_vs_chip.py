"""`trainer plan --platform tpu`'s peak beside what a TPU v5e chip reports, for `trainer bench`'s TPU cases.

The cases: presets qwen2.5-0.5b-shape and qwen2.5-1.5b-shape, full fine-tune and LoRA rank 16, model.remat
none and full; the micro-batch is what the plan picks at `auto` for one v5e (what `trainer bench` on the chip
picks), saved with the predictions so the chip runs the same settings without searching again (a case with
no saved prediction has its micro-batch picked on the chip, as `trainer bench` picks it: compiles more).

    # on a CPU host with libtpu (`uv sync --extra tpu`): the predictions alone, XLA:TPU ahead of time
    uv run python benchmarks/plan_vs_chip.py --dry --save benchmarks/data/plan_vs_chip.json
    # on the chip: each case's measurements beside the saved predictions (compiles only; --step runs a step too)
    python3 benchmarks/plan_vs_chip.py --predicted benchmarks/data/plan_vs_chip.json --step

Predicted: the plan's peak (resident state + the largest program's temporaries, or the startup) and its parts,
compiled by XLA:TPU for a `v5e:1x1` topology with no chip (trainer.plan.tpu_compile), against 15.75 GiB less 5%.

Measured on the chip, per case, the learner built as `trainer bench` builds it (random weights):
  resident   `bytes_in_use` of the chip's allocator once the learner holds its state (weights, optimizer
             state, frozen base);
  update     the learner's own jitted update (`TrainableModel.update_step`) lowered on its real state and a
             mini-batch of the plan's shapes, compiled by the chip's XLA:TPU: `memory_analysis()`'s temporaries;
  compiler   resident + update temporaries, the figure to set beside the plan's peak where the update is the
             largest program (the prediction line names its largest);
  step peak  with --step, `peak_bytes_in_use` after one `train_step` (rollout and update): on a TPU the
             allocator's peak leaves out programs' temporaries (a program of 13 GiB of them left it at
             1.01 GiB), so it is printed beside, not instead.
A case whose update XLA:TPU refuses, or whose state the allocator cannot hold, prints the refusal's line.
`--budget-s` (default 200) stops starting cases after that many seconds, so a call stays under 4 minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time
from pathlib import Path

PRESETS = ("qwen2.5-0.5b-shape", "qwen2.5-1.5b-shape")
LORA_RANK = 16
REMATS = ("none", "full")
GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Case:
    preset: str
    lora: bool
    remat: str

    @property
    def name(self) -> str:
        size = self.preset.removeprefix("qwen2.5-").removesuffix("-shape")
        return f"{size} {'lora16' if self.lora else 'full'} remat={self.remat}"

    def overrides(self) -> list[str]:
        return [f"model.remat={self.remat}", *([f"model.lora.rank={LORA_RANK}"] if self.lora else [])]


CASES = tuple(Case(p, lora, remat) for p in PRESETS for lora in (False, True) for remat in REMATS)


def case_settings(case: Case, micro_batch_size: int | str | None = "auto"):
    """`trainer bench`'s settings of `case` (bench_settings: random weights, AdamW, beta 0), as a TPU runs them;
    `micro_batch_size` None is the whole mini-batch, "auto" leaves the pick to the plan."""
    from trainer.bench.measure import bench_settings
    from trainer.bench.memory_check import as_run
    from trainer.bench.presets import PRESETS as BENCH

    p = BENCH[case.preset]
    micro = [f"training.micro_batch_size={'null' if micro_batch_size is None else micro_batch_size}"]
    return as_run(bench_settings(p, steps=p.warmup_steps + 1, overrides=[*case.overrides(), *micro]), "tpu")


def gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


# ---- the predictions: trainer plan --platform tpu, XLA:TPU ahead of time (a CPU host with libtpu) -------------

def predict(case: Case, devices, memo: dict) -> dict:
    """The plan's pick of the micro-batch at auto and its peak for one v5e, or the line that says why not."""
    from trainer.plan import memory_budget, plan
    from trainer.plan.choice import NothingFits, pick_memory, plan_training_peak
    from trainer.plan.device_memory import COMPILER_HEADROOM, tpu_chip_memory_gb
    from trainer.plan.refusal import ProgramRefused

    budget = memory_budget("tpu", device_memory_gb=tpu_chip_memory_gb(1), headroom=COMPILER_HEADROOM)

    def plan_of(settings):
        return plan(settings, budget, compiled_programs=memo, devices=devices, kernels=True)

    settings = case_settings(case)
    notes: list[str] = []
    try:
        settings, _ = pick_memory(settings, budget.limit_bytes, lambda s: plan_training_peak(plan_of(s)), "tpu",
                                  log=notes.append)
    except NothingFits as e:  # the plan's one line (the state alone over the chip, or no micro-batch under it)
        return {"case": case.name, "verdict": str(e).splitlines()[0], "micro_batch_size": e.last.micro_batch_size}
    micro = settings.training.micro_batch_size
    out = {"case": case.name, "micro_batch_size": micro, "pick": notes[-1] if notes else ""}
    try:
        result = plan_of(settings)
    except ProgramRefused as e:
        return out | {"verdict": e.verdict(), "needed_bytes": e.needed_bytes}
    programs = result.program_bytes
    largest = max(programs, key=programs.get)
    return out | {"verdict": result.verdict(), "peak_bytes": result.peak_bytes, "resident_bytes": result.resident_bytes,
                  "update_temporaries": programs["update"], "rollout_bytes": programs["rollout"],
                  "largest_program": largest, "startup_bytes": result.startup_bytes}


def dry(cases, save: Path | None) -> list[dict]:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the CPU backend stays JAX's; libtpu only compiles
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # another process on this host may hold libtpu
    from trainer.plan.tpu_compile import libtpu_importable, topology_devices

    if not libtpu_importable():
        sys.exit("plan_vs_chip --dry: libtpu is not installed here (uv sync --extra tpu): the predictions are XLA:TPU's")
    devices = topology_devices(1)
    memo: dict = {}
    rows = []
    for case in cases:
        start = time.perf_counter()
        row = predict(case, devices, memo)
        row["seconds"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        print(predicted_line(row), flush=True)
        if save:  # after each case: a long run stopped midway keeps what it has
            save.parent.mkdir(parents=True, exist_ok=True)
            save.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def predicted_line(row: dict) -> str:
    if "peak_bytes" not in row:
        return f"{row['case']:<26} predicted: {row['verdict']}"
    micro = row["micro_batch_size"] or "whole"
    return (f"{row['case']:<26} predicted peak {gib(row['peak_bytes'])} GiB (resident {gib(row['resident_bytes'])}, "
            f"update {gib(row['update_temporaries'])}, rollout {gib(row['rollout_bytes'])}; largest "
            f"{row['largest_program']}; micro-batch {micro}) [{row['seconds']} s]")


# ---- the chip: the learner's own programs, compiled and (--step) run ------------------------------------------

def chip_settings(case: Case, row: dict | None):
    """`case`'s settings with the micro-batch the prediction picked; without one, picked here as `trainer bench`
    picks it (trainer.bench.memory_check.fit_memory: compiled by the chip's XLA:TPU)."""
    from trainer.bench.memory_check import fit_memory
    from trainer.plan.choice import NothingFits

    if row is not None:
        return case_settings(case, row["micro_batch_size"])
    try:
        return fit_memory(case_settings(case), log=print)
    except NothingFits as e:  # measured at what keeps the least, as `trainer bench` then plans it
        print(f"{case.name:<26} pick: {str(e).splitlines()[0]}", flush=True)
        return case_settings(case, e.last.micro_batch_size)


def measure(case: Case, settings, step: bool) -> dict:
    """What the chip's compiler and allocator report for `case`'s learner with `settings` (see the module
    docstring)."""
    import jax
    from jax.errors import JaxRuntimeError
    from rl_core.policy import frozen as frozen_lib
    from trainer import build
    from trainer.plan.programs import policy_programs
    from trainer.plan.refusal import ProgramRefused, refusals_as_verdicts

    device = jax.devices()[0]
    in_use = lambda key="bytes_in_use": (device.memory_stats() or {}).get(key, 0)  # noqa: E731 - none on a CPU
    before = in_use()
    out: dict = {"case": case.name, "micro_batch_size": settings.training.micro_batch_size}
    try:
        task = settings.task.build()
        tokenizer = build.tokenizer(settings)
        policy = build.adapted(settings, build.new_model(settings, tokenizer))
        learner = build.learner(settings, task, tokenizer, policy, output_dir=None, progress=False)
        graphdef, params, frozen, _ = frozen_lib.split_policy(policy)
        programs = policy_programs(settings, learner.layout.mesh, graphdef, params, frozen)
        del policy, params, frozen  # with beta 0 nothing keeps the model as built (trainer.run drops it too)
    except JaxRuntimeError as e:  # the state itself over the chip: the allocator refuses it
        return out | {"refused": "the allocator refused the learner's state: " + str(e).splitlines()[0][:200]}
    gc.collect()
    out["resident_bytes"] = in_use() - before
    part = learner.policy
    batch = programs.mini_batch(learner.layout.num_micro_batches)
    try:
        with refusals_as_verdicts("tpu"):
            stats = part.update_step.lower(learner.state.policy, part.frozen, batch).compile().memory_analysis()
    except ProgramRefused as e:
        del learner
        return out | {"refused": e.verdict()}
    out |= {"update_temporaries": stats.temp_size_in_bytes, "update_arguments": stats.argument_size_in_bytes,
            "update_outputs": stats.output_size_in_bytes}
    out["compiler_peak_bytes"] = out["resident_bytes"] + stats.temp_size_in_bytes
    if step:
        start = time.perf_counter()
        try:
            learner.train_step()
            out["step_peak_bytes"] = in_use("peak_bytes_in_use") - before
            out["step_seconds"] = round(time.perf_counter() - start, 1)  # compiles included
        except JaxRuntimeError as e:
            out["step_failed"] = str(e).splitlines()[0][:200]
    del learner
    return out


def measured_line(row: dict) -> str:
    if "refused" in row:
        return f"{row['case']:<26} measured: {row['refused']}"
    step = (f"; step peak_bytes_in_use {gib(row['step_peak_bytes'])} (no temporaries), {row['step_seconds']} s"
            if "step_peak_bytes" in row else f"; step failed: {row['step_failed']}" if "step_failed" in row else "")
    micro = row.get("micro_batch_size") or "whole"
    return (f"{row['case']:<26} measured: resident + update temporaries {gib(row['compiler_peak_bytes'])} GiB "
            f"(resident {gib(row['resident_bytes'])}, update {gib(row['update_temporaries'])}; micro-batch "
            f"{micro}){step}")


def chip(cases, predicted: list[dict], step: bool, budget_s: float) -> None:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    print(f"device: {jax.devices()[0].device_kind}, {jax.default_backend()}; allocator limit "
          f"{gib(stats.get('bytes_limit'))} GiB", flush=True)
    by_name = {row["case"]: row for row in predicted}
    start = time.perf_counter()
    for case in cases:
        if time.perf_counter() - start > budget_s:
            print(f"{case.name:<26} not run: past --budget-s {budget_s:g}", flush=True)
            continue
        row = by_name.get(case.name)
        if row is not None:
            print(predicted_line(row), flush=True)
        case_start = time.perf_counter()
        result = measure(case, chip_settings(case, row), step)
        print(f"{measured_line(result)} [{time.perf_counter() - case_start:.0f} s]", flush=True)
        gc.collect()
        jax.clear_caches()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="the predictions alone (a CPU host with libtpu)")
    parser.add_argument("--save", type=Path, help="with --dry: write the predictions (JSON) here")
    parser.add_argument("--predicted", type=Path, help="on the chip: the predictions --dry saved (and their micro-batch)")
    parser.add_argument("--case", action="append", help="only these cases (e.g. '0.5b full remat=full'; repeatable)")
    parser.add_argument("--step", action="store_true", help="on the chip: run one train_step too (peak_bytes_in_use)")
    parser.add_argument("--budget-s", type=float, default=200.0, help="start no case after this many seconds")
    args = parser.parse_args()
    for name in args.case or ():
        if name not in {c.name for c in CASES}:
            parser.error(f"--case {name!r}: the cases are {', '.join(sorted(c.name for c in CASES))}")
    by_name = {c.name: c for c in CASES}
    cases = [by_name[name] for name in dict.fromkeys(args.case)] if args.case else list(CASES)  # in the order asked
    if args.dry:
        dry(cases, args.save)
        return 0
    predicted = json.loads(args.predicted.read_text()) if args.predicted else []
    chip(cases, predicted, args.step, args.budget_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
