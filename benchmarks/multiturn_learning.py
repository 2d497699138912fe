"""RL on episodes must learn: GRPO on the multi-turn `multiply` task discovers the calculator.

    uv run python benchmarks/multiturn_learning.py [RUN_DIR]   # exits 1 when a bar is missed

The suite runs a shorter cut of it (tests/trainer/test_trainer_learning_multiturn.py: a
300-step warm start, 12 steps, 100 problems); this is the full-length check.

From the default warm start (the teacher calls the tool on 30% of the problems), 25
GRPO steps of 32 prompts x 8 episodes; greedy held-out accuracy on 200 problems and
tool calls per episode before and after (docs/multi-turn.md's table is the same run at 100 steps).
Measured (seed 0, the 2-core CPU machine): accuracy 0.190 -> 0.820 and tool calls
per episode 0.31 -> 1.00 at step 25. The bar, +20 points and tool use above 0.8,
sits far below that.
"""

import json
import sys
import tempfile
from pathlib import Path

from rl_core.run import SUMMARY
from trainer.cli import main


def grpo_learns_to_call_the_tool(run: Path) -> None:
    argv = [
        "train", "--algo", "grpo", "--output", str(run), "--no-progress", "task.name=multiply",
        "training.num_steps=25", "training.checkpoint_every_steps=0", "eval.every_steps=0",
        "eval.heldout_size=200", "eval.samples_per_prompt=1", "eval.pass_k=1", "algorithm.group_size=8",
    ]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((run / SUMMARY).read_text())
    before, after = summary["before"], summary["after"]
    assert after["eval/accuracy"] >= before["eval/accuracy"] + 0.20, (before, after)
    assert before["eval/tool_calls_mean"] < 0.5 < 0.8 < after["eval/tool_calls_mean"], (before, after)


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()) / "run"
    grpo_learns_to_call_the_tool(folder)
    print(json.dumps(json.loads((folder / SUMMARY).read_text()), indent=2))
