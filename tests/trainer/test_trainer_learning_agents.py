"""An agent learns through the endpoint: tests/trainer/fixtures/agents.py:digits (two requests per
episode with the `openai` client, no project import; its reward, the share of digits in the model's
replies, comes back as a number through `episode_reward`) trains a random tiny Qwen3 from about
0.03 to about 1.0 in 20 GRPO steps, and so does its greedy reward on held-out prompts
(docs/results/2026-12-04-agent-learning.md: three seeds)."""

import json
import shutil
from pathlib import Path

import pytest

from trainer.cli import main

HERE = Path(__file__).resolve().parent
HF = HERE.parent / "fixtures" / "hf" / "qwen3"

pytestmark = pytest.mark.learning

DIGITS_RUN = [
    "task.name=multiply", f"rollout.agent={HERE / 'fixtures' / 'agents.py'}:digits", "rollout.environment=null",
    "rollout.engine=paged", "rollout.max_prompt_tokens=64", "rollout.max_new_tokens=64", "rollout.max_turns=2",
    "training.num_steps=20", "training.prompts_per_step=4", "algorithm.group_size=8", "warm_start.steps=0",
    "eval.every_steps=0", "eval.heldout_size=32", "eval.samples_per_prompt=1", "eval.pass_k=1",
    "training.learning_rate=1e-2", "algorithm.beta=0.0",
]
"""The run of the learning test and of the results file (with seed=0, 1, 2)."""


def test_an_agent_learns_through_the_endpoint(tmp_path):
    model = tmp_path / "tiny-qwen3"
    shutil.copytree(HF, model)
    shutil.copy(HERE / "fixtures" / "tool_chat_template.jinja", model / "chat_template.jinja")
    config = tmp_path / "digits.yaml"
    config.write_text("rewards:\n  agent:\n    function: episode_reward\n")
    run = tmp_path / "run"
    argv = ["train", "--algo", "grpo", "--config", str(config), "--output", str(run), "--no-progress",
            f"model.path={model}", *DIGITS_RUN]
    assert main(argv) == 0
    rewards = [json.loads(line)["episodes/env_reward_mean"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rewards) == 20
    assert sum(rewards[:3]) / 3 < 0.1  # random replies: about 10 digits in 320 tokens
    assert sum(rewards[-3:]) / 3 > 0.8
    summary = json.loads((run / "summary.json").read_text())  # the agent on 32 held-out prompts, greedy
    assert summary["before"]["eval/agent_reward_mean"] < 0.2 and summary["after"]["eval/agent_reward_mean"] > 0.8
