"""RL learns on rows of your own: the bring-your-own-task example, as its guide runs it (the TRL file
scored by my_rewards.py, config.yaml's 100 steps), raises held-out accuracy over its warm start.

The warm start imitates half of the training rows and RL draws the other half; when it imitated
every row, RL drew rows whose answers it had memorised and every group was uniform.
"""

import json
import shutil
from pathlib import Path

import pytest
from trainer.cli import main

pytestmark = pytest.mark.learning

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bring-your-own-task"

# Held-out accuracy (200 rows) after config.yaml's 100 GRPO steps from the base's 0.700
# (docs/results/2026-12-06-bring-your-own-task.md): this command 0.825 (+12.5 points); the guide's
# comparison's three GRPO seeds +9.0, +8.5, +10.5 and Dr. GRPO's +6.0, +6.5, +10.0. The bar, +4 points
# (8 problems), is 2 points below the smallest of the seven; a warm start stopped early on every row
# gained +4.2 and +4.5 (not significant), and one of 800 steps on every row lost 5 points in 300 steps.
GAIN = 0.04


def test_the_examples_100_steps_raise_heldout_accuracy(tmp_path, monkeypatch):
    shutil.copytree(EXAMPLE, tmp_path / "examples" / "bring-your-own-task", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "sums"
    assert main(["train", "--algo", "grpo", "--data", "examples/bring-your-own-task/sums.jsonl",
                 "--config", "examples/bring-your-own-task/config.yaml", "--output", str(run), "--no-progress"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    before, after = summary["before"]["eval/accuracy"], summary["after"]["eval/accuracy"]
    assert 0.3 < before < 0.85  # right often, not always: the warm start left RL something to learn
    assert summary["uniform_frac_mean"] < 0.8, summary["uniform_frac_mean"]  # most groups carry an advantage
    assert after >= before + GAIN, (before, after)
