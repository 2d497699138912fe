"""The start-of-run reward probe on runs of episodes (#69): a reward function that reads `episode`
(docs/multi-turn.md's `episode_return`) gets each probed completion's record, as in training."""

from pathlib import Path

from rewards import RewardManager

from trainer import build
from trainer.run import reward_audit
from trainer.run.train import load_task
from trainer.settings import build_settings

AGENT = Path(__file__).resolve().parents[2] / "examples" / "agents" / "multiply_agent.py"


def episode_return(prompts, completions, *, episode, **_):  # as docs/multi-turn.md shows it
    return [sum(e["rewards"]) for e in episode]


def pays_a_silent_first_turn(prompts, completions, *, episode, **_):
    return [float(e["turns"][0]["text"] == "") for e in episode]


def probed(overrides):
    settings = build_settings(algo="grpo", overrides=["reward_audit.probe_prompts=4", *overrides])
    tokenizer = build.tokenizer(settings)
    task = load_task(settings, tokenizer, log=lambda _: None)
    lines = []
    result = reward_audit.probe(RewardManager([episode_return, pays_a_silent_first_turn]), task, settings,
                                tokenizer, lines.append)
    return result, lines


def test_the_probe_gives_reward_functions_the_episode_of_each_completion():
    # multiply: the calculator answers a turn that calls no tool by ending the episode, paying 0
    result, lines = probed(["task.name=multiply"])
    assert result["failed"] == {}
    assert result["mean"]["episode_return"] == {"empty": 0.0, "echo": 0.0, "repeat": 0.0}
    assert result["flagged"] == {"pays_a_silent_first_turn": ["empty"]}  # the record's turn is the empty text
    assert lines == ["reward audit probe: 'pays_a_silent_first_turn' pays adversarial completions (mean score, "
                     "prompts paid): empty 1.00 (4/4 prompts)"]


def test_an_agent_run_probes_the_turn_alone():
    # the probe runs no agent: each record is the model's one turn, reward 0
    result, _ = probed(["task.name=multiply", f"rollout.agent={AGENT}:agent", "rollout.environment=null",
                        "rollout.engine=paged"])
    assert result["failed"] == {} and result["mean"]["episode_return"] == {"empty": 0.0, "echo": 0.0, "repeat": 0.0}
    assert result["flagged"] == {"pays_a_silent_first_turn": ["empty"]}


def test_a_single_turn_run_gives_no_episode():
    result, lines = probed([])
    assert set(result["failed"]) == {"episode_return", "pays_a_silent_first_turn"}
    assert "missing 1 required keyword-only argument: 'episode'" in result["failed"]["episode_return"]
