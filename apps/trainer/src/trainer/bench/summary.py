"""`trainer bench`'s results: each phase's medians, FLOPs and utilisation as one JSON-ready
record (`summarise`), and the table it prints (`print_table`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from rl_models import TransformerConfig

from trainer.bench.flops import block_matmul_weights, parameter_count
from trainer.bench.presets import BenchPreset

PHASES = ("rollout", "reward", "logprob", "update")
"""The learner's timed phases of a step (time/<phase>); what is left of time/step is `other`."""


def summarise(
    *,
    preset: str,
    description: str,
    algo: str,
    p: BenchPreset,
    cfg: TransformerConfig,
    peak: dict[str, float],
    records: Sequence[dict[str, Any]],
    flops: dict[str, float],
    needed: dict[str, float],
    tokens: dict[str, int],
    wall: float,
    compiles: dict[str, int],
    prefill: dict[str, float],
    decode: dict[str, float],
    model: str | None = None,
    phase_names: Sequence[str] = PHASES,
) -> dict[str, Any]:
    n = len(records)
    peak_rate = peak["flops_per_sec"]

    def times(key: str) -> np.ndarray:
        return np.asarray([r.get(key, 0.0) for r in records], np.float64)

    # Medians: on a shared machine a step that another process interrupts says little about this one.
    phases: dict[str, dict[str, float]] = {}
    for name in phase_names:
        seconds = float(np.median(times(f"time/{name}")))
        phase_flops, phase_needed = flops.get(name, 0.0) / n, needed.get(name, 0.0) / n
        rate = phase_flops / seconds if seconds > 0 else 0.0
        phases[name] = {
            "seconds": seconds,
            "mean_seconds": float(times(f"time/{name}").mean()),
            "model_flops": phase_flops,
            "flops_per_sec": rate,
            "mfu": rate / peak_rate,
            "needed_flops": phase_needed,
            "needed_of_peak": (phase_needed / seconds if seconds > 0 else 0.0) / peak_rate,
        }
    step = times("time/step")
    step_seconds = float(np.median(step))
    other = step - sum(times(f"time/{name}") for name in phase_names)
    phases["other"] = {
        "seconds": float(np.median(other)),
        "mean_seconds": float(other.mean()),
        "model_flops": 0.0,
        "flops_per_sec": 0.0,
        "mfu": 0.0,
        "needed_flops": 0.0,
        "needed_of_peak": 0.0,
    }
    step_flops, step_needed = sum(flops.values()) / n, sum(needed.values()) / n
    phases["step"] = {
        "seconds": step_seconds,
        "mean_seconds": float(step.mean()),
        "model_flops": step_flops,
        "flops_per_sec": step_flops / step_seconds,
        "mfu": step_flops / step_seconds / peak_rate,
        "needed_flops": step_needed,
        "needed_of_peak": step_needed / step_seconds / peak_rate,
    }
    for part in (prefill, decode):
        part["flops_per_sec"] = part["flops"] / part["seconds"] if part["seconds"] > 0 else 0.0
        part["mfu"] = part["flops_per_sec"] / peak_rate
        part["needed_of_peak"] = (part["needed_flops"] / part["seconds"] if part["seconds"] > 0 else 0.0) / peak_rate
    # each against its floor: the prefill's needed FLOPs at the matmul peak, a decode step's bytes at the
    # measured memory bandwidth (trainer.bench.flops.decode_floor_bytes)
    prefill["floor_seconds"] = prefill["needed_flops"] / peak_rate
    prefill["over_floor"] = prefill["seconds"] / prefill["floor_seconds"] if prefill["floor_seconds"] > 0 else 0.0
    floor = decode.get("floor_seconds_per_iteration", 0.0)
    decode["over_floor"] = decode["seconds_per_iteration"] / floor if floor > 0 else 0.0
    rollout_seconds = sum(r["time/rollout"] for r in records)
    return {
        "preset": preset,
        "description": description,
        "algo": algo,
        "machine": {
            "device": str(jax.devices()[0]),
            "platform": jax.default_backend(),
            "cpu_count": os.cpu_count(),
            "jax": jax.__version__,
        },
        "model": {
            "preset": None if model else p.model,
            "path": model,
            "hidden": cfg.hidden_size,
            "layers": cfg.num_layers,
            "heads": cfg.num_heads,
            "kv_heads": cfg.num_kv_heads,
            "mlp": cfg.mlp_hidden_size,
            "vocab": cfg.vocab_size,
            "tied_embeddings": cfg.tie_embeddings,
            "block_matmul_weights": block_matmul_weights(cfg),
            "parameters": parameter_count(cfg),
        },
        "batch": {
            "prompts": p.prompts,
            "group_size": p.group_size,
            "completions": p.prompts * p.group_size,
            "max_new_tokens": p.max_new_tokens,
        },
        "steps": {"warmup": p.warmup_steps, "timed": n, "wall_seconds": wall},
        "matmul_peak": peak,
        "rollout": {
            "tokens_per_sec": tokens["generated"] / rollout_seconds if rollout_seconds > 0 else 0.0,
            "generated_tokens_per_step": tokens["generated"] / n,
            "prompt_tokens_per_step": tokens["prompt"] / n,
        },
        "prefill": prefill,
        "decode": decode,
        "phases": phases,
        "mfu_step": phases["step"]["mfu"],
        "mfu_step_mean": phases["step"]["model_flops"] / phases["step"]["mean_seconds"] / peak_rate,
        "compile_count": compiles,
    }


def print_table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    peak = results["matmul_peak"]["flops_per_sec"]
    table = Table(title=f"trainer bench {results['preset']} ({results['algo']}): {results['steps']['timed']} timed "
                        "steps (median seconds; MFU: model FLOPs; of peak: needed FLOPs)")
    for column, justify in (("phase", "left"), ("seconds", "right"), ("model GFLOP", "right"),
                            ("GFLOP/s", "right"), ("MFU", "right"), ("needed GFLOP", "right"),
                            ("of peak", "right")):  # fmt: skip
        table.add_column(column, justify=justify)
    rows = [(name, ph["model_flops"], ph) for name, ph in results["phases"].items()]
    rows += [(f"{name} alone", results[name]["flops"], results[name]) for name in ("prefill", "decode")]
    for name, flops, ph in rows:
        table.add_row(
            name,
            f"{ph['seconds']:.4f}",
            f"{flops / 1e9:.3f}",
            f"{ph['flops_per_sec'] / 1e9:.2f}",
            f"{ph['mfu']:.1%}",
            f"{ph['needed_flops'] / 1e9:.3f}",
            f"{ph['needed_of_peak']:.1%}",
            style="bold" if name == "step" else None,
        )
    console = Console()
    console.print(table)
    decode = results["decode"]
    console.print(
        f"matmul peak {peak / 1e9:.1f} GFLOP/s (float32, best of "
        + ", ".join(f"{n}^2 {r / 1e9:.0f}" for n, r in results["matmul_peak"]["by_size"].items())
        + "); "
        f"rollout {results['rollout']['tokens_per_sec']:.0f} tokens/s "
        f"({results['rollout']['generated_tokens_per_step']:.0f} generated tokens/step); "
        f"decode {decode['seconds_per_iteration'] * 1e3:.2f} ms/iteration, "
        + (f"{decode['over_floor']:.1f}x its floor {decode['floor_seconds_per_iteration'] * 1e3:.2f} ms (weights + "
           f"mean live KV cache, {decode['floor_bytes_per_iteration'] / 1e6:.1f} MB at "
           f"{decode['memory_bytes_per_sec'] / 1e9:.0f} GB/s measured); " if decode.get("over_floor") else "; ")
        + f"prefill {results['prefill']['over_floor']:.1f}x its matmul floor "
        f"{results['prefill']['floor_seconds'] * 1e3:.2f} ms; "
        f"compiles: {results['compile_count']['first_step']} in the first step "
        f"({results['compile_count']['first_step_seconds']:.1f} s; the memory check's "
        f"{results['compile_count']['memory_check_seconds']:.1f} s before; "
        f"{results['compile_count']['total_seconds']:.1f} s in all), "
        f"{results['compile_count']['after_first_step']} after it "
        f"({results['compile_count']['timed_delta']} during the timed steps); "
        f"whole-step MFU {results['mfu_step']:.1%} (median step; {results['mfu_step_mean']:.1%} on the mean), "
        f"needed work {results['phases']['step']['needed_of_peak']:.1%} of the peak"
    )
