"""A killed `trainer train` resumes to exactly the uninterrupted run, on this host's own backend
(a TPU's too: one process at a time holds the chip, so each run is its own process and this one
touches JAX only after they have ended).

    python benchmarks/resume_check.py OUT [key=value ...]

Runs a short GRPO run straight through in OUT/straight, and the same run in OUT/run killed
(SIGKILL, `RL_VARIANTS_FAULTS`) after step 3 is logged and again in its final evaluation, resumed
with `--resume` each time. Prints a line per comparison (metrics but timings, samples, summary,
checkpoints 3 and 4 bit for bit) and exits 1 if any differs. tests/trainer/test_trainer_crash_resume.py
checks more points on the CPU; on an accelerator host its trainer processes run on the CPU (the
test process holds the chip), so this script is the check there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FAULTS = "RL_VARIANTS_FAULTS"  # rl_core.run.faults.ENV, without importing JAX here
KILLED = -9
SETTINGS = [
    "task.name=countdown", "task.options.heldout_size=8", "warm_start.steps=8", "warm_start.batch_size=16",
    "training.num_steps=4", "training.prompts_per_step=2", "training.checkpoint_every_steps=1",
    "training.max_checkpoints_to_keep=2", "algorithm.group_size=2", "eval.samples_per_prompt=1",
    "eval.pass_k=1", "eval.every_steps=0",
]  # fmt: skip
"""tests/trainer/test_trainer_crash_resume.py's run: countdown's format reward makes steps 3 and 4 real updates."""


def trainer(args: list[str], faults: str | None = None, timeout: float = 900) -> int:
    env = {k: v for k, v in os.environ.items() if k != FAULTS}
    if faults:
        env[FAULTS] = faults
    done = subprocess.run([sys.executable, "-m", "trainer.cli", "train", *args, "--no-progress"], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode not in (0, KILLED):
        sys.stderr.write(done.stderr[-3000:])
    return done.returncode


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def without_timings(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith("time/") and k != "perf/tokens_per_sec"}


def differences(straight: Path, run: Path) -> list[str]:
    """What differs between the two finished runs (empty: none)."""
    import jax  # noqa: PLC0415 (after the runs: they held the device)
    import numpy as np  # noqa: PLC0415
    import orbax.checkpoint as ocp  # noqa: PLC0415

    found = []
    a, b = rows(straight / "metrics.jsonl"), rows(run / "metrics.jsonl")
    if [r["step"] for r in b] != [r["step"] for r in a]:
        found.append(f"metrics steps {[r['step'] for r in b]} against {[r['step'] for r in a]}")
    found += [f"metrics of step {x['step']}" for x, y in zip(a, b) if without_timings(x) != without_timings(y)]
    if rows(straight / "samples.jsonl") != rows(run / "samples.jsonl"):
        found.append("samples")
    sa, sb = (json.loads((r / "summary.json").read_text()) for r in (straight, run))
    sa.pop("train_seconds", None), sb.pop("train_seconds", None)
    if sa != sb:
        found.append(f"summary: {sorted(k for k in sa.keys() | sb.keys() if sa.get(k) != sb.get(k))}")
    for step in (3, 4):
        saved = [ocp.StandardCheckpointer().restore((r / "checkpoints" / str(step) / "arrays").absolute())
                 for r in (straight, run)]
        if jax.tree.structure(saved[0]) != jax.tree.structure(saved[1]):
            found.append(f"checkpoint {step}: another tree")
            continue
        unequal = sum(not np.array_equal(np.asarray(x), np.asarray(y))
                      for x, y in zip(jax.tree.leaves(saved[0]), jax.tree.leaves(saved[1]), strict=True))
        if unequal:
            found.append(f"checkpoint {step}: {unequal} of {len(jax.tree.leaves(saved[0]))} arrays differ")
    return found


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    out, extra = Path(argv[0]), [*SETTINGS, *argv[1:]]
    straight, run = out / "straight", out / "run"
    steps = [
        ("straight through", ["--algo", "grpo", "--output", str(straight), "--overwrite", *extra], None, 0),
        ("killed after step 3 is logged", ["--algo", "grpo", "--output", str(run), "--overwrite", *extra],
         "kill@logged:3", KILLED),
        ("resumed, killed in the final evaluation", ["--resume", str(run)], "kill@final_eval", KILLED),
        ("resumed to the end", ["--resume", str(run)], None, 0),
    ]
    for what, args, faults, expected in steps:
        code = trainer(args, faults)
        print(f"{what}: exit {code}", flush=True)
        if code != expected:
            print(f"resume check: FAILED, `{what}` exited {code} where {expected} was expected")
            return 1
    found = differences(straight, run)
    for line in found:
        print(f"differs: {line}")
    print("resume check: " + ("FAILED" if found else "the resumed run equals the uninterrupted one (metrics but "
                              "timings, samples, summary, checkpoints 3 and 4 bit for bit)"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
