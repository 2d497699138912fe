"""A remote reward in a run: the `rewards:` settings section, and (e2e) a few training steps of the
tiny model scored by a real HTTP server on loopback (tests/support/reward_server.py)."""

import json

import pytest
from rl_core.config import ConfigError

from rewards import RewardManager

from trainer.settings import build_settings
from trainer.settings.reward_functions import model_judges, reward_specs

from reward_server import RewardServer
from tolerances import approx


def test_reward_specs_by_name_weight_and_options():
    specs = reward_specs({
        "served": {"function": "remote_score", "weight": 0.5, "options": {"url": "http://127.0.0.1:1/score"}},
        "format_strict": None,  # the function named like the entry, weight 1, default options
    })
    assert [(s.name, s.weight) for s in specs] == [("served", 0.5), ("format_strict", 1.0)]
    assert specs[0].fn.__name__ == "served"  # its metrics are rewards/served/<counter>
    assert specs[0].fn.settings.url == "http://127.0.0.1:1/score"


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"x": {"function": "remote_scor"}}, r"rewards.x \(function 'remote_scor'\).*Did you mean 'remote_score'"),
        ({"x": {"function": "remote_score", "options": {"url": "ftp://h"}}}, r"rewards.x .*url must be an http"),
        ({"x": {"function": "remote_score", "option": {}}}, r"rewards.x.option: not a key"),
        ({"x": {"function": "gsm8k", "weight": "heavy"}}, r"rewards.x.weight = 'heavy'"),
        ({"x": {"function": "gsm8k", "options": [1]}}, r"rewards.x.options"),
        ({"a b": {"function": "gsm8k"}}, r"rewards.a b: a reward's name"),
        ({"x": 3}, r"rewards.x = 3: must be a mapping"),
        ({"x": {"kind": "remot"}}, r"rewards.x.kind = 'remot': must be one of function, remote, judge"),
        ({"x": {"kind": "remote", "function": "remote_score"}}, r"rewards.x.function: a reward of kind remote names no"),
        ({"x": {"kind": "remote", "options": {"url": "ftp://h"}}}, r"rewards.x \(kind remote\): .*url must be an http"),
        ({"x": {"kind": "judge"}}, r"rewards.x \(kind judge\): name its model: options.path"),
        ({"x": {"kind": "judge", "options": {"pth": "m"}}}, r"rewards.x \(kind judge\): .*no field 'pth'; did you mean 'path'"),
        ({"x": {"kind": "judge", "options": {"run": "r", "weight": 2}}}, r"rewards.x.options.weight: a judge entry's weight"),
        ({"x": {"kind": "judge", "timeout_s": 0, "options": {"run": "r"}}}, r"rewards.x.timeout_s = 0: must be a number"),
    ],
)
def test_bad_entries_name_what_is_wrong(section, match):
    with pytest.raises(ConfigError, match=match):
        reward_specs(section)


def test_remote_and_served_judge_kinds_score_as_their_functions_do():
    """`kind: remote` is remote_score and `kind: judge` with a url is remote_judge, through the same manager:
    the loopback server's scores, hand-checked (/score without an answer: length / 100; the judge: the count of
    "good" in its message out of 10)."""
    completions = ["good", "good good good", "bad"]
    with RewardServer() as server:
        score_options = {"url": server.url("/score"), "fields": []}
        judge_options = {"url": server.url("/v1/chat/completions"), "model": "tiny-judge", "template": "{completion}"}
        kinds = reward_specs({"api": {"kind": "remote", "weight": 0.5, "options": score_options},
                              "helpful": {"kind": "judge", "weight": 2.0, "options": judge_options}})
        functions = reward_specs({"api": {"function": "remote_score", "weight": 0.5, "options": score_options},
                                  "helpful": {"function": "remote_judge", "weight": 2.0, "options": judge_options}})
        by_kind = RewardManager(kinds).score(["p"] * 3, completions, {})
        by_function = RewardManager(functions).score(["p"] * 3, completions, {})
    assert by_kind.per_function == by_function.per_function == {
        "api": (0.04, 0.14, 0.03),  # 4, 14 and 3 characters
        "helpful": (0.1, 0.3, 0.0),  # "Score: 1", "Score: 3", "Score: 0" on 0..10
    }
    assert by_kind.total == approx((0.5 * 0.04 + 2 * 0.1, 0.5 * 0.14 + 2 * 0.3, 0.5 * 0.03))
    assert model_judges({"api": {"kind": "remote", "options": score_options}}, build_settings().judge) == ()


def test_a_judge_model_entry_and_the_judge_section_are_one_kind():
    """`rewards: {helpful: {kind: judge, options: {...}}}` holds the judge: section's settings under the entry's
    name and weight, with the keys every kind takes; it is loaded with the run's model, not built here."""
    entry = build_settings(algo="grpo", overrides=[
        "rewards.helpful.kind=judge", "rewards.helpful.weight=0.5", "rewards.helpful.options.train_steps=3",
        "rewards.helpful.options.verdict=yes_probability", "rewards.helpful.data_sources=[carry]"])
    section = build_settings(algo="grpo", overrides=["judge.name=helpful", "judge.weight=0.5", "judge.train_steps=3",
                                                     "judge.verdict=yes_probability"])
    [by_entry] = model_judges(entry.rewards, entry.judge)
    [by_section] = model_judges(section.rewards, section.judge)
    assert by_entry.settings == by_section.settings == section.judge
    assert (by_entry.name, by_entry.weight, by_entry.data_sources) == ("helpful", 0.5, ("carry",))
    assert reward_specs(entry.rewards) == ()  # not a function: the trainer loads the model
    with pytest.raises(ConfigError, match=r"rewards: \['helpful'\] named twice"):
        build_settings(algo="grpo", overrides=["rewards.helpful.kind=judge", "rewards.helpful.options.train_steps=3",
                                               "judge.name=helpful", "judge.train_steps=3"])


@pytest.mark.e2e
def test_a_run_trains_with_a_reward_served_over_http(tmp_path):
    """Three GRPO steps of the tiny model on arithmetic, with two more rewards over HTTP from the
    loopback server: a scorer (a completion's length in characters / 100, sent without fields)
    and a chat-completions judge (`Score: N`, N = how often its message says "good": 0 here).
    Every completion of every step goes to the server or a cache, the step's metrics count the
    requests, and the server's scores are the ones logged and weighted into the total."""
    from trainer.cli import main

    with RewardServer() as server:
        config = tmp_path / "remote.yaml"
        config.write_text(
            "rewards:\n"
            "  served:\n"
            "    function: remote_score\n"
            "    weight: 0.5\n"
            f"    options: {{url: '{server.url('/score')}', timeout_s: 5,"
            " step_timeout_s: 60, on_failure: stop}\n"
            "  judged:\n"
            "    function: remote_judge\n"
            "    weight: 2.0\n"
            f"    options: {{url: '{server.url('/v1/chat/completions')}', model: tiny-judge, timeout_s: 5,"
            " template: 'Q: {prompt} A: {completion} (expected {answer})', on_failure: stop}\n"
        )
        run = tmp_path / "run"
        argv = [
            "train", "--algo", "grpo", "--config", str(config), "--output", str(run), "--no-progress",
            "training.num_steps=3", "training.checkpoint_every_steps=0", "warm_start.steps=0",
            "training.prompts_per_step=4", "algorithm.group_size=4", "eval.every_steps=0",
            "eval.heldout_size=8", "eval.samples_per_prompt=1", "eval.pass_k=1",
            "reward_audit.probe_prompts=0",  # no start-up probe: every request is a step's
        ]  # fmt: skip
        assert main(argv) == 0
        served, judged = server.requests["/score"], server.requests["/v1/chat/completions"]
        judge_body = next(body for body in server.bodies if "messages" in body)
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "rewards/served/requests" in m]
    assert len(steps) == 3
    for m in steps:
        # 4 prompts x 4 completions: each asked once, or answered from the cache
        assert m["rewards/served/requests"] + m["rewards/served/cache_hits"] == 16
        assert m["rewards/served/failed"] == m["rewards/served/retries"] == 0
        assert m["rewards/judged/requests"] + m["rewards/judged/cache_hits"] == 16
        assert m["rewards/judged/failed"] == 0 and m["rewards/judged/mean"] == 0.0
        # the server's scores, weighted into the total: 1 x task + 0.5 x served + 2 x judged
        assert m["rewards/served/mean"] > 0
        expected = m["rewards/numeric_answer/mean"] + 0.5 * m["rewards/served/mean"] + 2.0 * m["rewards/judged/mean"]
        assert m["rewards/total/mean"] == approx(expected, abs=1e-6)
    assert served == sum(m["rewards/served/requests"] for m in steps)
    assert judged == sum(m["rewards/judged/requests"] for m in steps)
    assert judge_body["model"] == "tiny-judge"
    assert judge_body["messages"][0]["content"].startswith("Q: ") and "(expected " in judge_body["messages"][0]["content"]
    # kept with the run, so a resumed run scores with the same server
    assert json.loads((run / "settings_at_start.json").read_text())["rewards"]["served"]["function"] == "remote_score"


@pytest.mark.learning
def test_the_policy_learns_a_reward_served_over_http(tmp_path):
    """Six GRPO steps of the tiny model from random weights, rewarded only through the loopback
    server's /ones (the share of a completion's characters that are "1"): the served reward rises
    from near 0 (about one character in the vocabulary) to most of each completion. Measured:
    0.006, 0.016, 0.204, 0.800, 0.952, 0.991 (docs/results/2026-12-04-remote-reward.md)."""
    from trainer.cli import main

    with RewardServer() as server:
        config = tmp_path / "ones.yaml"
        config.write_text(
            "rewards:\n"
            "  ones:\n"
            "    function: remote_score\n"
            f"    options: {{url: '{server.url('/ones')}', timeout_s: 5, step_timeout_s: 60, on_failure: stop}}\n"
        )
        run = tmp_path / "run"
        argv = [
            "train", "--algo", "grpo", "--config", str(config), "--output", str(run), "--no-progress",
            "training.num_steps=6", "training.checkpoint_every_steps=0", "warm_start.steps=0",
            "training.prompts_per_step=8", "algorithm.group_size=8", "training.learning_rate=0.01",
            "eval.every_steps=0", "eval.heldout_size=8", "eval.samples_per_prompt=1", "eval.pass_k=1",
            "reward_audit.probe_prompts=0",
        ]  # fmt: skip
        assert main(argv) == 0
    means = [m["rewards/ones/mean"] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if "rewards/ones/mean" in m]
    assert len(means) == 6
    assert means[0] < 0.1  # a random policy writes few "1"s
    assert means[-1] > 0.5  # the served reward was learned
