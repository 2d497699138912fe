"""The multi-turn task end to end: `trainer compare` runs it for every installed variant.

Shortened: a 5-step warm start, one RL step per variant, one seed, 4 held-out
problems. Each run's evaluation runs whole episodes with the calculator, and the
settings carry the task's environment into `rollout`.
"""

import contextlib
import io
import json
import math

import pytest
from trainer.cli import main
from trainer.compare.sweep import default_algos
from trainer.settings import build_settings

pytestmark = pytest.mark.e2e

TINY = [
    "task.name=multiply",
    "warm_start.steps=5",
    "training.num_steps=1",
    "training.prompts_per_step=2",
    "training.mini_batch_size=4",
    "algorithm.group_size=2",
    "eval.heldout_size=4",
    "eval.samples_per_prompt=1",
    "eval.pass_k=1",
    "eval.every_steps=0",
    "training.checkpoint_every_steps=0",
]


def test_the_task_brings_its_environment_into_the_rollout_settings():
    rollout = build_settings(overrides=["task.name=multiply"]).rollout
    assert (rollout.environment, rollout.max_turns, rollout.max_turn_tokens, rollout.max_new_tokens) == (
        "calculator", 3, 21, 50)
    assert build_settings(overrides=["task.name=multiply", "rollout.max_turns=2"]).rollout.max_turns == 2
    assert build_settings().rollout.environment is None  # single-turn tasks stay single-turn


def test_compare_runs_the_multi_turn_task_for_every_variant(tmp_path):
    out = tmp_path / "cmp"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["compare", "--seeds", "1", "--output", str(out), "--no-progress", *TINY])
    assert code == 0, printed.getvalue()[-2000:]
    assert (out / "results.json").exists() and (out / "report.md").exists()
    for algo in default_algos():  # compare's default: every algorithm that needs no teacher
        run = out / algo / "seed-0"
        summary = json.loads((run / "summary.json").read_text())
        assert "eval/tool_calls_mean" in summary["after"], algo
        sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
        assert sample["turns"][0]["role"] == "model"  # every turn with its role
        metrics = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
        assert 0 < metrics["episodes/model_token_frac"] <= 1
        # the variant's own update on episodes ran: a finite loss, nothing skipped
        assert math.isfinite(metrics["train/loss"]) and metrics["train/skipped_updates"] == 0, algo
