"""What each run of a `trainer` command compiles, and what the persistent compilation cache saves.

    uv run python benchmarks/compile_cache.py compare grpo dr_grpo --seeds 1 --output runs/cc --no-progress
    uv run python benchmarks/compile_cache.py train --algo grpo --output runs/cc-train --no-progress

Runs the `trainer` command in this process with JAX's monitoring listeners on, and prints one line
per training run (`trainer.run.train_run`: each variant and seed of a compare) and one for the
whole command: programs built (compiled, or loaded from the cache), the cache's hits and misses
(misses include programs too quick to be kept: under 0.1 s of compiling), and the seconds spent
tracing, lowering to StableHLO, and compiling or loading. Run it twice with the same
XDG_CACHE_HOME (or JAX_COMPILATION_CACHE_DIR) and a new --output: the second run's compile
seconds are what the cache leaves (docs/training.md#compiled-programs-are-kept-between-runs).
"""

from __future__ import annotations

import collections
import sys
import time
from typing import Any

from jax import monitoring

EVENTS = {
    "/jax/core/compile/backend_compile_duration": "programs",
    "/jax/compilation_cache/cache_hits": "hits",
    "/jax/compilation_cache/cache_misses": "misses",
}
SECONDS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    "/jax/core/compile/backend_compile_duration": "compile_or_load_s",
}
counts: collections.Counter = collections.Counter()


def _event(event: str, **_: Any) -> None:
    if event in EVENTS:
        counts[EVENTS[event]] += 1


def _duration(event: str, seconds: float, **_: Any) -> None:
    _event(event)
    if event in SECONDS:
        counts[SECONDS[event]] += seconds


def line(what: str, before: collections.Counter, seconds: float) -> str:
    now = counts - before
    parts = [f"{name} {now[name]}" for name in EVENTS.values()]
    parts += [f"{name} {now[name]:.2f}" for name in SECONDS.values()]
    return f"{what}: wall {seconds:.1f} s; " + ", ".join(parts)


def main(argv: list[str]) -> int:
    monitoring.register_event_listener(_event)
    monitoring.register_event_duration_secs_listener(_duration)
    import trainer.run
    from trainer.cli import main as cli
    from trainer.compare import sweep

    lines = []

    def timed(real):
        def train_run(settings, run_dir, *args, **kwargs):
            before, start = counts.copy(), time.perf_counter()
            out = real(settings, run_dir, *args, **kwargs)
            lines.append(line(f"run {settings.name}/{run_dir.name}", before, time.perf_counter() - start))
            return out
        return train_run

    # where each command finds it: compare's module holds its own name, `trainer train` imports it when it runs
    sweep.train_run = timed(sweep.train_run)
    trainer.run.train_run = timed(trainer.run.train_run)
    start = time.perf_counter()
    code = cli(argv)
    lines.append(line(f"trainer {argv[0] if argv else ''} (exit {code})", collections.Counter(),
                      time.perf_counter() - start))
    print("\n".join(lines), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
