"""The worked example end to end: `trainer train` with `rollout.agent` naming
examples/agents/multiply_agent.py (an agent with a calculator tool that imports only `json`; the
trainer hands it an `openai.AsyncOpenAI`), on a tiny Qwen3 folder with a tool-aware chat template."""

import json
import math
import shutil
from pathlib import Path

import pytest

from trainer.cli import main

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "fixtures" / "hf" / "qwen3"
TEMPLATE = Path(__file__).resolve().parent / "fixtures" / "tool_chat_template.jinja"
EXAMPLE = ROOT / "examples" / "agents" / "multiply_agent.py"


def test_the_example_agent_imports_nothing_of_the_project():
    imports = [line for line in EXAMPLE.read_text().splitlines() if line.startswith(("import ", "from "))]
    assert imports == ["import json"]


@pytest.mark.e2e
def test_trainer_trains_the_example_agent_through_the_endpoint(tmp_path):
    model = tmp_path / "tiny-qwen3"
    shutil.copytree(HF, model)
    shutil.copy(TEMPLATE, model / "chat_template.jinja")
    run = tmp_path / "run"
    argv = [
        "train", "--algo", "grpo", "--output", str(run), "--no-progress", f"model.path={model}", "task.name=multiply",
        f"rollout.agent={EXAMPLE}:agent", "rollout.environment=null", "rollout.engine=paged",
        "rollout.max_prompt_tokens=400", "rollout.max_new_tokens=160", "rollout.max_turns=3",
        "training.num_steps=2", "training.prompts_per_step=2", "algorithm.group_size=2", "warm_start.steps=0",
        "eval.every_steps=0", "eval.heldout_size=2", "eval.samples_per_prompt=1", "eval.pass_k=1",
    ]  # fmt: skip
    assert main(argv) == 0
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    for metrics in steps:
        assert metrics["episodes/env_errors"] == 0.0 and metrics["episodes/turns_mean"] >= 1.0
        assert metrics["episodes/model_token_frac"] > 0
    summary = json.loads((run / "summary.json").read_text())
    for when in ("before", "after"):  # held-out accuracy is the agent's: its episodes, greedy
        assert summary[when]["eval/agent_errors"] == 0.0 and summary[when]["eval/turns_mean"] >= 1.0
        assert summary[when]["eval/agent_reward_mean"] == 0.0  # the example returns its answer's text
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["turns"] and s["turns"][0]["role"] == "model" for s in samples)


@pytest.mark.e2e
def test_agent_rollouts_run_ahead_with_partial_rollouts(tmp_path):
    """Async rollouts one step ahead, new weights taken mid-rollout: every reply's tokens carry the
    version that sampled them, which the staleness metrics read."""
    model = tmp_path / "tiny-qwen3"
    shutil.copytree(HF, model)
    shutil.copy(TEMPLATE, model / "chat_template.jinja")
    config = tmp_path / "digits.yaml"
    config.write_text("rewards:\n  agent:\n    function: episode_reward\n")
    run = tmp_path / "run"
    agents = Path(__file__).resolve().parent / "fixtures" / "agents.py"
    argv = [
        "train", "--algo", "grpo", "--config", str(config), "--output", str(run), "--no-progress",
        f"model.path={model}", "task.name=multiply", f"rollout.agent={agents}:digits", "rollout.environment=null",
        "rollout.engine=paged", "rollout.max_prompt_tokens=64", "rollout.max_new_tokens=64", "rollout.max_turns=2",
        "training.num_steps=3", "training.prompts_per_step=2", "algorithm.group_size=4", "warm_start.steps=0",
        "eval.every_steps=0", "eval.heldout_size=2", "eval.samples_per_prompt=1", "eval.pass_k=1",
        "training.async_rollout=one_step", "rollout.partial_rollouts=continue",
    ]  # fmt: skip
    assert main(argv) == 0
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["episodes/env_errors"] for m in steps] == [0.0, 0.0, 0.0]
    assert steps[0]["rollout/staleness_token_lag_max"] == 0.0  # the first collection: the first weights
    assert all(m["rollout/staleness_token_lag_max"] in (0.0, 1.0) for m in steps[1:])


@pytest.mark.e2e
def test_a_run_trains_every_segment_of_a_rewritten_history(tmp_path):
    """An agent that summarises its history: each episode is two sequences, and the step trains
    both, the earlier one as an extra row of the update (whole micro-batches more)."""
    model = tmp_path / "tiny-qwen3"
    shutil.copytree(HF, model)
    shutil.copy(TEMPLATE, model / "chat_template.jinja")
    config = tmp_path / "summarises.yaml"
    config.write_text("rewards:\n  agent:\n    function: episode_reward\n")
    run = tmp_path / "run"
    agents = Path(__file__).resolve().parent / "fixtures" / "agents.py"
    argv = [
        "train", "--algo", "grpo", "--config", str(config), "--output", str(run), "--no-progress",
        f"model.path={model}", "task.name=multiply", f"rollout.agent={agents}:summarises", "rollout.environment=null",
        "rollout.engine=paged", "rollout.max_prompt_tokens=64", "rollout.max_new_tokens=32", "rollout.max_turns=2",
        "training.num_steps=2", "training.prompts_per_step=2", "algorithm.group_size=2", "warm_start.steps=0",
        "eval.every_steps=0", "eval.heldout_size=2", "eval.samples_per_prompt=1", "eval.pass_k=1",
    ]  # fmt: skip
    assert main(argv) == 0
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for metrics in steps:
        assert metrics["episodes/env_errors"] == 0.0
        assert metrics["episodes/earlier_segments"] == 4.0  # 2 prompts x 2 episodes, one earlier segment each
        assert math.isfinite(metrics["train/loss"])
        assert metrics["advantages/mean"] == pytest.approx(0.0, abs=1e-6)  # the episodes': zero-mean per group
