"""Shared trainer fixtures: a trained run folder for the `trainer eval` and `trainer export`
tests, and the runs of the learning tests."""

import contextlib
import fcntl
import os
from pathlib import Path

import pytest

from trainer.cli import main
from trainer.run import train_run
from trainer.settings import build_settings

LR, WEIGHT_DECAY = 0.05, 0.1


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
def learn(tmp_path_factory, learning_base):
    """Train `algo` from the default warm start and return the held-out accuracy (before, after).

    The warm start (800 steps) and the base policy's evaluation run once for the whole suite:
    the first run makes them while holding a lock, and every later run, in any worker, reads them.
    The learning tests are split over files so that pytest-xdist runs them on both workers."""

    def train(algo: str, overrides, name: str) -> tuple[float, float]:
        settings = build_settings(algo=algo, overrides=[*LEARNING_STEPS, *overrides])
        run_dir = tmp_path_factory.mktemp(name)
        summary = train_run(settings, run_dir, progress=False, log=lambda _: None, base_cache=learning_base)
        before, after = summary["before"]["eval/accuracy"], summary["after"]["eval/accuracy"]
        print(f"{name}: held-out accuracy {before:.3f} -> {after:.3f}")
        return before, after

    def run(algo: str, overrides=(), name: str | None = None) -> tuple[float, float]:
        made = learning_base / "made"
        if not made.exists():
            with exclusive(learning_base / "lock"):
                if not made.exists():
                    result = train(algo, overrides, name or algo)
                    made.touch()
                    return result
        return train(algo, overrides, name or algo)

    return run
