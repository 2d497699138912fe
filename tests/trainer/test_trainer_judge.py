"""A judge model as a reward, end to end: a run's policy judges another run's completions
through the rollout engine, its scores enter the total reward and the advantages, and its
time is in the step's metrics (docs/judge-rewards.md)."""

import json

import numpy as np
import pytest
from rewards import RewardManager
from rl_core.policy.logprobs import completion_logprobs
from rl_core.run.layout import METRICS, SAMPLES

from trainer.cli import main
from trainer.judge.reward import JudgeReward, judge_model, judge_rewards
from trainer.settings import build_settings
from tolerances import approx, close

pytestmark = pytest.mark.e2e

RUN = [
    "training.num_steps=2", "training.checkpoint_every_steps=0", "warm_start.steps=0", "eval.every_steps=0",
    "eval.heldout_size=4", "eval.samples_per_prompt=1", "eval.pass_k=1",
    "training.prompts_per_step=4", "algorithm.group_size=4", "algorithm.beta=0.0", "--no-progress",
]  # fmt: skip
TEMPLATE = "{prompt}{completion} vs {reference}?"


def records(run):
    return [json.loads(line) for line in (run / METRICS).read_text().splitlines() if line]


@pytest.mark.parametrize(("verdict", "engine"), [("yes_probability", "auto"), ("yes_no", "paged")])
def test_a_judge_reward_trains_end_to_end(trained_run, tmp_path, verdict, engine):
    run = tmp_path / "run"
    argv = ["train", "--algo", "grpo", "--output", str(run), *RUN, f"judge.run={trained_run}",
            f"judge.template='{TEMPLATE}'", f"judge.verdict={verdict}", f"judge.engine={engine}",
            "judge.weight=0.5", "judge.max_prompt_tokens=48", "judge.max_new_tokens=4"]
    assert main(argv) == 0
    steps = records(run)
    assert len(steps) == 2
    for m in steps:
        # the total is the task's reward plus 0.5 x the judge's, per completion and so in the mean
        assert m["rewards/total/mean"] == approx(m["rewards/numeric_answer/mean"] + 0.5 * m["rewards/judge/mean"],
                                                        abs=1e-6)
        assert 0.0 <= m["rewards/judge/mean"] <= 1.0
        assert 0.0 < m["time/judge"] <= m["time/reward"]  # the judge's share of scoring
        assert m["rewards/judge/unparsed"] >= 0.0
    if verdict == "yes_probability":
        # a random-init policy never answers right, so only the judge's probabilities differ within
        # groups: they give the advantages (uniform groups would leave every advantage 0)
        assert all(m["rewards/numeric_answer/mean"] == 0.0 for m in steps)
        assert all(m["groups/uniform_frac"] < 1.0 for m in steps)
        assert all(m["rewards/judge/unparsed"] == 0.0 for m in steps)
        samples = [json.loads(line) for line in (run / SAMPLES).read_text().splitlines() if line]
        assert len({round(s["reward"], 6) for s in samples}) > 1
        assert any(abs(s["advantage"]) > 0 for s in samples)
    else:  # greedy replies read by the yes_no rule: every reply scored 1, 0 or unparsed_score 0
        n = 16
        for m in steps:
            scored = m["rewards/judge/mean"] * n
            assert abs(scored - round(scored)) < 1e-4  # a count of yes replies
            assert round(scored) + m["rewards/judge/unparsed"] <= n


def test_a_judge_entry_of_rewards_trains_end_to_end(trained_run, tmp_path):
    """The judge as a `rewards:` entry of kind judge: its scores, named by the entry, enter the total."""
    run = tmp_path / "run"
    judge = [f"run={trained_run}", f"template='{TEMPLATE}'", "verdict=yes_probability", "max_prompt_tokens=48"]
    argv = ["train", "--algo", "grpo", "--output", str(run), *RUN, "rewards.helpful.kind=judge",
            "rewards.helpful.weight=0.5", *(f"rewards.helpful.options.{o}" for o in judge)]
    assert main(argv) == 0
    steps = records(run)
    assert len(steps) == 2
    for m in steps:
        assert m["rewards/total/mean"] == approx(m["rewards/numeric_answer/mean"] + 0.5 * m["rewards/helpful/mean"],
                                                        abs=1e-6)
        assert 0.0 < m["rewards/helpful/mean"] < 1.0  # probabilities, never exactly 0 or 1
        assert 0.0 < m["time/helpful"] <= m["time/reward"]
        assert "rewards/judge/mean" not in m  # no judge: section, no second judge


def test_the_judge_scores_by_the_learners_own_logprobs(trained_run):
    """yes_probability reads the same log-probs the learner's scoring pass gives the first reply
    token, and the greedy reply starts with the most likely token."""
    settings = build_settings(algo="grpo", overrides=[f"judge.run={trained_run}", "judge.max_prompt_tokens=32",
                                                      "judge.engine=static"])
    judge = judge_model(settings, log=lambda _: None)
    prompts = ["1+2=3 vs 3?", "4+4=9 vs 8?", "12+30=42 vs 42?"]
    pair = judge.yes_logprobs(prompts, "yes", "no")
    tokens, mask = judge.encode(prompts)
    model = judge.model()
    for column, word in enumerate(("y", "n")):
        target = np.full((len(prompts), 1), judge.first_token(word), np.int32)
        logp, _ = completion_logprobs(model, tokens, mask, target)
        np.testing.assert_allclose(pair[:, column], np.asarray(logp)[:, 0], **close(atol=1e-5))
    # the greedy reply's first character is the argmax of the first position's distribution
    first = judge.first_logprobs(prompts)
    replies = judge.replies(prompts)
    for row, reply in zip(np.asarray(first), replies, strict=True):
        if reply:
            assert judge.first_token(reply[0]) == int(np.argmax(row))


def test_a_judge_prompt_too_long_is_not_judged_but_counted(trained_run):
    settings = build_settings(algo="grpo", overrides=[f"judge.run={trained_run}", "judge.max_prompt_tokens=12",
                                                      "judge.engine=static", "judge.verdict=yes_probability",
                                                      "judge.template='{completion}?'", "judge.unparsed_score=0.25"])
    reward = JudgeReward(judge_model(settings, log=lambda _: None), settings.judge)
    # "12?" and BOS: 4 tokens, judged; "a completion of 20?" and BOS: 21 > 12, scored 0.25 and counted
    scores = reward(["1+1=", "1+1="], ["12", "a completion of 20"])
    assert scores[1] == 0.25 and 0.0 < scores[0] < 1.0
    assert scores.metrics["rewards/judge/too_long"] == 1.0 and scores.metrics["rewards/judge/unparsed"] == 0.0
    with pytest.raises(ValueError, match="longer than judge.max_prompt_tokens = 12"):
        reward.judge.replies(["a completion of 20?"])


def test_number_words_trains_on_a_judge_it_warm_starts_itself(tmp_path, capsys):
    """The built-in task judged by a model: its tiny judge is warm-started on CPU, agrees with the
    task's answers on held-out examples, and is the whole training reward (the exact checker,
    spelled_answer, has weight 0 and shows how often the judge was right)."""
    run = tmp_path / "run"
    argv = ["train", "--algo", "grpo", "--task", "number_words", "--output", str(run), "judge.train_steps=300",
            "warm_start.steps=100", "training.num_steps=3", "training.checkpoint_every_steps=0", "eval.every_steps=0",
            "training.prompts_per_step=8", "algorithm.group_size=4", "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    agreed = float(out.split("judge: agrees with the task's answers on ")[1].split("%")[0])
    assert agreed >= 90.0
    for m in records(run):
        # spelled_answer weighs 0: the total is the judge's probability alone
        assert m["rewards/total/mean"] == approx(m["rewards/judge/mean"], abs=1e-6)
        assert 0.0 < m["time/judge"] <= m["time/reward"]
        assert 0.0 <= m["rewards/spelled_answer/mean"] <= 1.0
    # a second run finds the trained judge in its cache folder (the run folder) instead of training it
    assert main([*argv, "--overwrite"]) == 0
    assert "trained judge cached at" in capsys.readouterr().out


def test_a_judge_entry_of_rewards_scores_as_the_judge_section_does(trained_run):
    """A `rewards:` entry of kind judge is the judge: section's judge under the entry's name: the same
    model gives the same yes-probabilities, and the entry's data_sources route rows like any reward's."""
    judge = [f"run={trained_run}", "max_prompt_tokens=32", "engine=static", "verdict=yes_probability",
             "template='{completion}?'"]
    section = build_settings(algo="grpo", overrides=[f"judge.{o}" for o in judge])
    entry = build_settings(algo="grpo", overrides=[*(f"rewards.helpful.options.{o}" for o in judge),
                                                   "rewards.helpful.kind=judge", "rewards.helpful.weight=0.5",
                                                   "rewards.helpful.data_sources=[sums]"])
    [by_section] = judge_rewards(section, log=lambda _: None)
    [by_entry] = judge_rewards(entry, log=lambda _: None)
    assert (by_section.name, by_section.weight) == ("judge", 1.0)
    assert (by_entry.name, by_entry.weight, by_entry.data_sources) == ("helpful", 0.5, ("sums",))
    completions = ["12", "7", "40"]
    fields = {"data_source": ["sums", "other", "sums"]}
    judged = RewardManager([by_section]).score(["1+1="] * 3, completions, fields)
    routed = RewardManager([by_entry]).score(["1+1="] * 3, completions, fields)
    scores = judged.per_function["judge"]
    assert all(0.0 < x < 1.0 for x in scores)
    # the row of source "other" is not the entry's: unscored (0 in its list), out of its mean and the total
    assert routed.per_function["helpful"] == approx((scores[0], 0.0, scores[2]), abs=1e-6)
    assert routed.scored["helpful"] == (True, False, True)
    assert routed.total == approx((0.5 * scores[0], 0.0, 0.5 * scores[2]), abs=1e-6)
