"""A `verifiers` environment trained through the endpoint: `rollout.agent=trainer.verifiers:agent` runs
each episode as one rollout of the verifiers taskset `rl_variants_math` (apps/trainer/verifiers_envs/)
in the verifiers venv, its OpenAI client on the episode's endpoint, its rubric's reward the episode's.

The `verifiers` tier (`uv run pytest -m verifiers`) needs the venv that scripts/verifiers-env.sh makes
(verifiers pins openai<3; the workspace locks openai 3): without it the tier skips, saying so."""

import json
import shutil
from pathlib import Path

import pytest

from trainer import verifiers
from trainer.cli import main

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "fixtures" / "hf" / "qwen3"
TEMPLATE = Path(__file__).resolve().parent / "fixtures" / "tool_chat_template.jinja"


def test_the_adapter_scores_a_rollout_by_its_rubric_weights(tmp_path):
    """The episode's reward is the rubric's weighted sum, read from vf-eval's traces.jsonl."""
    run = tmp_path / "run-1"
    run.mkdir()
    trace = {"ok": True, "rewards": {"correct": {"score": 1.0, "weight": 1.0}, "number": {"score": 1.0, "weight": 0.2}}}
    (run / "traces.jsonl").write_text(json.dumps({"ok": True, "errors": [], "traces": [trace]}) + "\n")
    assert verifiers.scored(tmp_path) == (pytest.approx(1.2), trace["rewards"])
    (run / "traces.jsonl").write_text(json.dumps({"ok": False, "errors": [{"message": "model unreachable"}],
                                                  "traces": []}) + "\n")
    with pytest.raises(ValueError, match="^the verifiers rollout failed: model unreachable$"):
        verifiers.scored(tmp_path)


def test_without_the_venv_an_episode_ends_with_the_command_to_make_it(tmp_path, monkeypatch):
    monkeypatch.setenv("VERIFIERS_PYTHON", str(tmp_path / "none" / "bin" / "python"))
    with pytest.raises(ValueError, match="run scripts/verifiers-env.sh"):
        verifiers.vf_eval()


@pytest.mark.e2e
@pytest.mark.verifiers
def test_trainer_trains_a_verifiers_environment_through_the_endpoint(tmp_path):
    if not (verifiers.verifiers_python().parent / "vf-eval").is_file():
        pytest.skip(f"no verifiers venv at {verifiers.verifiers_python().parent.parent}: run scripts/verifiers-env.sh")
    model = tmp_path / "tiny-qwen3"
    shutil.copytree(HF, model)
    shutil.copy(TEMPLATE, model / "chat_template.jinja")
    config = tmp_path / "verifiers.yaml"
    config.write_text("rewards:\n  rubric:\n    function: episode_reward\n")
    run = tmp_path / "run"
    argv = [
        "train", "--algo", "grpo", "--config", str(config), "--output", str(run), "--no-progress",
        f"model.path={model}", "task.name=multiply", "rollout.agent=trainer.verifiers:agent",
        "rollout.environment=null", "rollout.engine=paged", "rollout.max_prompt_tokens=128",
        "rollout.max_new_tokens=24", "rollout.agent_timeout_s=240", "training.num_steps=2",
        "training.prompts_per_step=2", "algorithm.group_size=2", "warm_start.steps=0", "eval.every_steps=0",
        "eval.heldout_size=2", "eval.samples_per_prompt=1", "eval.pass_k=1",
    ]  # fmt: skip
    assert main(argv) == 0
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    for metrics in steps:
        assert metrics["episodes/env_errors"] == 0.0  # every verifiers rollout ran and was scored
        assert metrics["episodes/turns_mean"] == 1.0  # the taskset is single-turn: one request per episode
        assert metrics["episodes/model_token_frac"] == 1.0
        # the rubric's weighted sum: 1.0 x correct + 0.2 x number, so one of 0, 0.2, 1.2 per episode
        assert 0.0 <= metrics["rewards/total/mean"] <= 1.2
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {round(s["reward"], 6) for s in samples} <= {0.0, 0.2, 1.2}
    assert all(s["turns"] and s["turns"][0]["role"] == "model" for s in samples)
