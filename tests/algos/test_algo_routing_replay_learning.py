"""GRPO learns on a tiny mixture of experts with bfloat16 rollout weights, with and without routing
replay, and replay narrows the engine/trainer gap: the suite's cut of benchmarks/routing_replay_grpo.py
(one seed, 20 steps; the benchmark's three seeds are in docs/results/2026-12-05-routing-replay.md)."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.learning

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "routing_replay_grpo.py"


def benchmark(monkeypatch):
    """The benchmark script as a module (registered while the test runs: its dataclass needs it)."""
    spec = importlib.util.spec_from_file_location("routing_replay_grpo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_grpo_learns_with_and_without_replay_and_replay_narrows_the_gap(monkeypatch):
    grpo = benchmark(monkeypatch)
    free = grpo.run("off", "bfloat16", seed=0, steps=20)
    replayed = grpo.run("rollout", "bfloat16", seed=0, steps=20)
    for run in (free, replayed):  # the share of digits rises from about a third
        assert run.reward_last >= run.reward_first + 0.3, run
    # without replay, a routing flip moves a token's log-prob by tenths of a nat; replayed, what
    # is left is bfloat16 rounding (the dense fixture's model-level gap: 4.3e-3 mean, 2.8e-2 largest)
    assert replayed.logp_abs_max < 0.5 * free.logp_abs_max, (replayed, free)
    assert replayed.logp_abs_mean < free.logp_abs_mean, (replayed, free)
    assert replayed.clip_frac <= free.clip_frac, (replayed, free)
