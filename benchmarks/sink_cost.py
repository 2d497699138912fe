"""What watching a run costs: each sink's seconds to open and milliseconds per logged step, and
`trainer show`'s time to draw its plots, on a finished run folder's records.

    uv run python benchmarks/sink_cost.py RUN_FOLDER [--sinks console,mlflow,trackio] [--repeats 3]

A sink's open time counts its own imports (the tracker's library), not rl_core's. Each sink
gets the run's records replayed step by step (rl_core.run.records.replay), as the
recorder sends them while a run goes, in a process of its own (imports count, as in a run):
MLflow's file store and trackio's database in a temporary folder; the console table printed at
every step into memory (a run prints it every `training.console_samples_every_steps`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import io, json, sys, time
from pathlib import Path
from rl_core.run.records import RunRecords, replay  # rl_core (and JAX) load in every run anyway
start = time.perf_counter()
kind, run, tmp = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
if kind == "mlflow":
    from rl_core.run.mlflow_sink import MlflowSink
    sink = MlflowSink(tmp, config={"algo": "measure"}, name="measure/run")
elif kind == "trackio":
    from rl_core.run.trackio_sink import TrackioSink
    sink = TrackioSink(config={"algo": "measure"}, name="measure/run")
else:
    from rich.console import Console
    from rl_core.run.console_samples import ConsoleSamples
    sink = ConsoleSamples(every_steps=1, console=Console(file=io.StringIO(), width=120))
opened = time.perf_counter()
records = RunRecords(run)
steps = len(records.metrics())
replay(records, sink)
replayed = time.perf_counter()
sink.close()
print(json.dumps({"open_s": opened - start, "step_ms": (replayed - opened) / steps * 1000,
                  "close_s": time.perf_counter() - replayed, "steps": steps}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--sinks", default="console,mlflow,trackio")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    for kind in args.sinks.split(","):
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "TRACKIO_"))}
                env["TRACKIO_DIR"] = str(Path(tmp) / "trackio")
                done = subprocess.run([sys.executable, "-c", CHILD, kind, str(args.run), tmp], env=env,
                                      capture_output=True, text=True, check=True)
                row = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"{kind:8s} open {row['open_s']:6.2f} s  per step {row['step_ms']:6.2f} ms  "
                      f"close {row['close_s']:5.2f} s  ({row['steps']} steps)")
    from rich.console import Console

    from trainer.show import show_run

    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as null:
            copy = Path(tmp) / "run"
            subprocess.run(["cp", "-r", str(args.run), str(copy)], check=True)
            start = time.perf_counter()
            show_run(copy, console=Console(file=null), plots=False)
            summary = time.perf_counter() - start
            start = time.perf_counter()
            show_run(copy, console=Console(file=null))
            print(f"show     summary {summary:5.2f} s  summary and 9 plots {time.perf_counter() - start:5.2f} s")


if __name__ == "__main__":
    main()
