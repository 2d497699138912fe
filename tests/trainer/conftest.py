"""Shared trainer fixtures: a trained run folder for the `trainer eval` and `trainer export`
tests, and the runs of the learning tests."""

import contextlib
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.cli import main

LR, WEIGHT_DECAY = 0.05, 0.1
LEARNING_RUN = Path(__file__).parent / "scripts" / "learning_run.py"


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """A two-step GRPO run folder from `trainer train`, with checkpoints at steps 1 and 2.

    Random initial weights (no warm start) never answer right, so every group is
    tied and every gradient is exactly 0; AdamW's decoupled weight decay still
    moves the weights, by a known factor per step (`decay_per_step`):
    p_n = p_0 * (1 - lr * wd)^n.
    """
    run = tmp_path_factory.mktemp("eval") / "run"
    argv = [
        "train", "--algo", "grpo", "--output", str(run), "--no-progress",
        "training.num_steps=2", "training.checkpoint_every_steps=1", "warm_start.steps=0",
        f"training.learning_rate={LR}", f"training.weight_decay={WEIGHT_DECAY}",
        "eval.heldout_size=16", "eval.samples_per_prompt=4", "eval.pass_k=2", "eval.every_steps=0",
        "training.prompts_per_step=4", "algorithm.group_size=2", "algorithm.beta=0.0",
    ]  # fmt: skip
    assert main(argv) == 0
    return run


@pytest.fixture(scope="session")
def decay_per_step():
    return 1 - LR * WEIGHT_DECAY


LEARNING_STEPS = [
    "training.num_steps=100",
    "training.checkpoint_every_steps=0",
    "eval.every_steps=0",
    "eval.heldout_size=200",
    "eval.samples_per_prompt=1",
    "eval.pass_k=1",
]
"""The learning tests: 100 steps, greedy accuracy on 200 held-out problems before and after."""


@pytest.fixture(scope="session")
def learning_base(tmp_path_factory) -> Path:
    """One folder for the learning tests' base policy and its evaluation, shared by every
    pytest-xdist worker (their session temp folders share a parent)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder = root / "learning-base"
    folder.mkdir(exist_ok=True)
    return folder


@contextlib.contextmanager
def exclusive(lock: Path):
    """Held by one process at a time (an advisory lock on `lock`)."""
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def learn(tmp_path_factory, learning_base, trainer_xla_flags):
    """Train `algo` from the default warm start and return the held-out accuracy (before, after).

    The warm start (800 steps) and the base policy's evaluation run once for the whole suite:
    the first run makes them while holding a lock, and every later run, in any worker, reads them.
    The learning tests are split over files so that pytest-xdist runs them on both workers."""

    def train(algo: str, overrides, name: str, shuffled_rewards: bool) -> dict:
        run_dir = tmp_path_factory.mktemp(name)
        env = {**os.environ, "XLA_FLAGS": trainer_xla_flags}  # not the suite's compile-time flags (see the script)
        control = ["--shuffled-rewards"] if shuffled_rewards else []
        command = [sys.executable, str(LEARNING_RUN), *control, algo, str(run_dir), str(learning_base),
                   *LEARNING_STEPS, *overrides]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stderr[-4000:]
        result = {**json.loads(done.stdout.splitlines()[-1]), "run_dir": run_dir}
        print(f"{name}: held-out accuracy {result['before']:.3f} -> {result['after']:.3f}")
        return result

    def run(algo: str, overrides=(), name: str | None = None, *, shuffled_rewards: bool = False,
            final_metrics: bool = False, folder: bool = False) -> tuple:
        """(accuracy before, after), and with `final_metrics` every metric of the final evaluation,
        with `folder` the run folder (e.g. a distillation teacher's).
        `shuffled_rewards`: the control run (see scripts/learning_run.py), which must not learn."""
        made = learning_base / "made"
        result = None
        if not made.exists():
            with exclusive(learning_base / "lock"):
                if not made.exists():
                    result = train(algo, overrides, name or algo, shuffled_rewards)
                    made.touch()
        if result is None:
            result = train(algo, overrides, name or algo, shuffled_rewards)
        out = (result["before"], result["after"])
        out = (*out, result["after_metrics"]) if final_metrics else out
        return (*out, result["run_dir"]) if folder else out

    return run
