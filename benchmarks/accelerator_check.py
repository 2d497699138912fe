"""The Python steps of benchmarks/accelerator_check.sh: the device, and one `trainer bench` run.

    python benchmarks/accelerator_check.py device
    python benchmarks/accelerator_check.py bench --out DIR [--steps N] PRESET [key=value ...]

`device` prints the devices and exits 1 on a host without an accelerator. `bench` runs the preset
(`trainer.bench.measure.run_bench`, with the trainer's compilation cache), writes its JSON to
DIR/bench-NAME.json and its numbers to DIR/summary-NAME.json (NAME: the preset and overrides), and
prints one `SUMMARY:` line: step time, rollout tokens/s, MFU against the measured matmul peak and
against the device's nominal bfloat16 peak, the device's peak memory. A preset that does not fit
(the plan's verdict, or the TPU compiler's refusal) prints its one-line verdict as the summary and
exits 0: that is the answer the check asks for.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import jax
from trainer.bench.measure import run_bench
from trainer.bench.memory_check import DoesNotFit
from trainer.bench.presets import PRESETS
from trainer.user_cache import use_compilation_cache

NOMINAL_BF16_FLOPS = {"NVIDIA H200": 989e12, "NVIDIA H100": 989e12, "NVIDIA A100": 312e12, "NVIDIA L4": 121e12,
                      "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12,
                      "TPU v6 lite": 918e12}
"""Nominal dense bfloat16 peaks (FLOP/s) of common accelerators, by the prefix of jax's device_kind."""


def device() -> int:
    d = jax.devices()[0]
    print(f"devices: {jax.device_count()} x {d.device_kind} ({jax.default_backend()}), jax {jax.__version__}")
    if jax.default_backend() == "cpu":
        print("no accelerator here: this check is for GPU or TPU hosts")
        return 1
    return 0


def summary(preset: str, overrides: list[str], result: dict[str, Any], kind: str, stats: dict[str, Any]) -> dict:
    """The numbers the check reports of one bench `result` on a device of `kind` with memory `stats`."""
    nominal = next((v for k, v in NOMINAL_BF16_FLOPS.items() if kind.startswith(k)), None)
    step = result["phases"]["step"]
    return {
        "preset": preset,
        "overrides": overrides,
        "device": kind,
        "step_seconds": step["seconds"],
        "rollout_seconds": result["phases"]["rollout"]["seconds"],
        "update_seconds": result["phases"]["update"]["seconds"],
        "rollout_tokens_per_sec": result["rollout"]["tokens_per_sec"],
        "decode_ms_per_iteration": result["decode"]["seconds_per_iteration"] * 1e3,
        "mfu_vs_measured_peak": result["mfu_step"],
        "measured_peak_flops": result["matmul_peak"]["flops_per_sec"],
        "mfu_vs_nominal_bf16_peak": step["model_flops"] / step["seconds"] / nominal if nominal else None,
        "peak_memory_gib": stats.get("peak_bytes_in_use", 0) / 2**30,
        "compiles_after_first_step": result["compile_count"]["after_first_step"],
    }


def bench(preset: str, out: Path, steps: int, overrides: list[str]) -> int:
    if preset not in PRESETS:
        raise SystemExit(f"unknown preset {preset!r}; presets are {', '.join(sorted(PRESETS))}")
    use_compilation_cache()  # as `trainer bench` does: the memory check's programs are the learner's
    name = "-".join([preset, *(o.replace("=", "_") for o in overrides)])
    out.mkdir(parents=True, exist_ok=True)
    try:
        result = run_bench(preset=preset, steps=steps, output=out / f"bench-{name}.json", overrides=overrides)
    except DoesNotFit as e:  # the memory check's verdict: an answer, not a failure
        print(f"SUMMARY: {name}: {e}", flush=True)
        return 0
    numbers = summary(preset, overrides, result, jax.devices()[0].device_kind, jax.devices()[0].memory_stats() or {})
    (out / f"summary-{name}.json").write_text(json.dumps(numbers, indent=2) + "\n")
    print(f"SUMMARY: {name}: {words(numbers)}", flush=True)
    return 0


def words(n: dict[str, Any]) -> str:
    """The summary's numbers on one line, for a person."""
    nominal = n["mfu_vs_nominal_bf16_peak"]
    return (f"step {n['step_seconds']:.3f} s (rollout {n['rollout_seconds']:.3f}, update {n['update_seconds']:.3f}); "
            f"rollout {n['rollout_tokens_per_sec']:,.0f} tokens/s, "
            f"decode {n['decode_ms_per_iteration']:.2f} ms/iteration; MFU {n['mfu_vs_measured_peak']:.1%} of the "
            f"measured {n['measured_peak_flops'] / 1e12:.1f} TFLOP/s"
            + (f" ({nominal:.1%} of the nominal bfloat16 peak)" if nominal else "")
            + f"; peak memory {n['peak_memory_gib']:.2f} GiB; "
            f"{n['compiles_after_first_step']} compiles after the first step")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("device", help="the devices; exit 1 without an accelerator")
    b = sub.add_parser("bench", help="one trainer bench run and its summary line")
    b.add_argument("preset")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--steps", type=int, default=5)
    b.add_argument("overrides", nargs="*", metavar="key=value")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return device() if args.command == "device" else bench(args.preset, args.out, args.steps, args.overrides)


if __name__ == "__main__":
    sys.exit(main())
