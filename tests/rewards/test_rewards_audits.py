"""Reward audits (rewards.audits, rewards.auditor) on literal batches, with the arithmetic shown."""

import json
import math

import pytest

from rewards import RewardManager, RewardSpec
from rewards.audits import (
    ADVERSARIAL_KINDS,
    adversarial_completions,
    constant_in_groups,
    length_correlation,
    next_streak,
    probe_rewards,
    reward_shares,
    unfinished_rewarded,
)
from rewards.auditor import AuditLimits, RewardAuditor, Trip, step_audit, summarize, trips


def test_unfinished_rewarded_counts_only_rewarded_completions():
    # rewarded: 0 (finished), 1 (cut), 3 (cut); 2 is unrewarded and cut, so it does not count: 2 / 3
    assert unfinished_rewarded([1.0, 0.5, 0.0, 2.0], [True, False, False, False]) == pytest.approx(2 / 3)
    assert unfinished_rewarded([0.0, -1.0], [False, False]) == 0.0  # nothing rewarded: nothing to audit
    assert unfinished_rewarded([1.0, 1.0], [True, True]) == 0.0
    with pytest.raises(ValueError, match="total has 2 entries, finished 1"):
        unfinished_rewarded([1.0, 1.0], [True])


def test_length_correlation_is_pearson():
    # dx = (-.5, -.5, .5, .5), dy = (-1.5, -.5, .5, 1.5): sum dx dy = 2, sxx = 1, syy = 5: r = 2 / sqrt(5)
    assert length_correlation([0.0, 0.0, 1.0, 1.0], [1, 2, 3, 4]) == pytest.approx(2 / math.sqrt(5), abs=1e-12)
    assert length_correlation([1.0, 2.0, 3.0], [30, 20, 10]) == pytest.approx(-1.0)
    assert length_correlation([1.0, 1.0, 1.0], [1, 2, 3]) == 0.0  # constant reward: no correlation to report
    assert length_correlation([0.0, 1.0], [5, 5]) == 0.0
    assert length_correlation([1.0], [3]) == 0.0


def test_constant_in_groups_and_streaks():
    assert constant_in_groups([1.0, 1.0, 0.0, 0.0], 2)  # each group one value, though the batch varies
    assert not constant_in_groups([1.0, 0.0, 1.0, 1.0], 2)
    assert constant_in_groups([0.3, 0.3, 0.3], 3)
    with pytest.raises(ValueError, match="3 scores do not split into groups of 2"):
        constant_in_groups([1.0, 1.0, 1.0], 2)
    assert [next_streak(s, c) for s, c in ((0, True), (4, True), (4, False))] == [1, 5, 0]


def test_reward_shares_weigh_magnitudes():
    # a: |1*1| + |1*-1| = 2; b: |2*.5| + |2*.5| = 2: half each (a penalty counts by its size)
    assert reward_shares({"a": [1.0, -1.0], "b": [0.5, 0.5]}, {"a": 1.0, "b": 2.0}) == {"a": 0.5, "b": 0.5}
    # a: 3 * (1 + 0) = 3, b: 1 * (1 + 1) = 2: 3/5 and 2/5
    shares = reward_shares({"a": [1.0, 0.0], "b": [1.0, 1.0]}, {"a": 3.0, "b": 1.0})
    assert shares == {"a": pytest.approx(0.6), "b": pytest.approx(0.4)}
    assert reward_shares({"a": [0.0], "b": [0.0]}, {"a": 1.0, "b": 1.0}) == {"a": 0.0, "b": 0.0}
    assert reward_shares({"a": [1.0], "b": [3.0]}, {}) == {"a": 0.25, "b": 0.75}  # unweighted: weight 1


def test_step_audit_metrics_and_streaks():
    kwargs = dict(weights={"right": 1.0, "fmt": 1.0}, lengths=[2, 4, 8, 8], finished=[True, True, False, False],
                  group_size=2)
    # fmt pays 1 everywhere (constant in both groups), right varies in the first group
    per_function = {"right": [1.0, 0.0, 0.0, 0.0], "fmt": [1.0, 1.0, 1.0, 1.0]}
    total = [2.0, 1.0, 1.0, 1.0]
    metrics, streaks = step_audit(total=total, per_function=per_function, streaks={"fmt": 6}, **kwargs)
    assert streaks == {"right": 0, "fmt": 7}
    # rewarded: all 4, cut: the last 2 -> 0.5; shares: right 1 / 5, fmt 4 / 5
    # r: dx = (.75, -.25, -.25, -.25), dy = (-3.5, -1.5, 2.5, 2.5): sum = -3.5, sxx = .75, syy = 27
    assert metrics == {
        "reward_audit/unfinished_rewarded": 0.5,
        "reward_audit/length_corr": pytest.approx(-3.5 / math.sqrt(0.75 * 27)),
        "reward_audit/share/right": pytest.approx(0.2),
        "reward_audit/share/fmt": pytest.approx(0.8),
        "reward_audit/constant_groups_steps/right": 0.0,
        "reward_audit/constant_groups_steps/fmt": 7.0,
    }
    one, _ = step_audit(total=total, per_function=per_function, streaks={}, **{**kwargs, "group_size": 1})
    assert not any("constant_groups" in key for key in one)  # a group of one has nothing to compare


def test_trips_are_strictly_over_the_limits_and_spare_the_correctness_share():
    limits = AuditLimits(unfinished_rewarded_max=0.25, length_corr_max=0.5, constant_steps=3, share_max=0.5)
    at_limits = {"reward_audit/unfinished_rewarded": 0.25, "reward_audit/length_corr": 0.5,
                 "reward_audit/constant_groups_steps/a": 2.0, "reward_audit/share/a": 0.5}
    assert trips(at_limits, limits, correctness="a") == []
    over = {"reward_audit/unfinished_rewarded": 0.3, "reward_audit/length_corr": 0.9,
            "reward_audit/constant_groups_steps/a": 3.0, "reward_audit/share/a": 0.9, "reward_audit/share/b": 0.6}
    assert trips(over, limits, correctness="a") == [
        Trip("unfinished_rewarded", None, 0.3, 0.25), Trip("length_corr", None, 0.9, 0.5),
        Trip("constant_groups", "a", 3.0, 3), Trip("share", "b", 0.6, 0.5),
    ]
    off = AuditLimits(unfinished_rewarded_max=1.0, length_corr_max=1.0, constant_steps=0, share_max=1.0)
    assert trips({**over, "reward_audit/share/b": 1.0}, off, correctness="a") == []


@pytest.mark.parametrize("bad", [{"share_max": 1.5}, {"length_corr_max": -0.1}, {"constant_steps": -1},
                                 {"constant_steps": True}])
def test_limits_are_checked(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        AuditLimits(**bad)


def test_auditor_warns_once_per_kind_with_the_numbers():
    lines = []
    auditor = RewardAuditor(AuditLimits(constant_steps=2), correctness="right", log=lines.append)
    # the hack: "long" pays the two cut completions; "right" never pays
    step = dict(total=[0.0, 1.0, 0.0, 1.0], per_function={"right": [0.0] * 4, "long": [0.0, 1.0, 0.0, 1.0]},
                weights={"right": 1.0, "long": 1.0}, lengths=[3, 8, 3, 8], finished=[True, False, True, False],
                group_size=2)
    first = auditor(step=1, **step)
    assert first["reward_audit/unfinished_rewarded"] == 1.0
    assert first["reward_audit/length_corr"] == pytest.approx(1.0)
    assert first["reward_audit/share/long"] == 1.0
    assert first["reward_audit/tripped"] == 3.0  # unfinished, length, long's share; right constant 1 step only
    second = auditor(step=2, **step)
    assert second["reward_audit/constant_groups_steps/right"] == 2.0
    assert second["reward_audit/tripped"] == 4.0
    assert lines == [
        "reward audit, step 1: 100% of the rewarded completions did not finish (hit max_new_tokens without EOS; "
        "limit 25%): a reward may be paying truncated completions",
        "reward audit, step 1: reward correlates with completion length (r = 1.00 > 0.50): a reward may be paying "
        "length",
        "reward audit, step 1: reward 'long' makes 100% of the weighted total (limit 50%), more than the correctness "
        "reward should leave it",
        "reward audit, step 2: reward 'right' has been the same within every group for 2 steps (limit 2): it gives "
        "no advantage, so no learning signal",
    ]  # step 2 repeats none of step 1's


def test_summarize_counts_steps_first_step_and_worst():
    records = [{"step": 1, "reward_audit/unfinished_rewarded": 0.1},
               {"step": 2, "reward_audit/unfinished_rewarded": 0.5},
               {"step": 3, "reward_audit/unfinished_rewarded": 0.9, "reward_audit/constant_groups_steps/a": 20.0}]
    assert summarize(records, AuditLimits(), correctness="a") == {
        "unfinished_rewarded": {"steps": 2, "first_step": 2, "worst": 0.9},
        "constant_groups/a": {"steps": 1, "first_step": 3, "worst": 20.0},
    }


def test_adversarial_completions():
    assert adversarial_completions("2+2=", max_new_tokens=3) == {"empty": "", "echo": "2+2=", "repeat": "the the the "}
    assert tuple(adversarial_completions("p", max_new_tokens=1)) == ADVERSARIAL_KINDS


def _scorer(manager):
    """Score with one of the manager's functions alone, as the trainer does."""
    by_name = {spec.name: spec for spec in manager.specs}
    return lambda name, prompts, completions, fields: RewardManager([by_name[name]]).score(
        prompts, completions, fields).per_function[name]


def test_probe_flags_the_functions_that_pay_adversarial_completions():
    def exact(prompts, completions, *, answer, **_):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    def pays_long(prompts, completions, *, completion_lengths, **_):
        return [n / 8 for n in completion_lengths]  # paid by the token: the hack

    def pays_echo_of_zero(prompts, completions, **_):
        return [float(c == "0+4=") for c in completions]  # pays one prompt's echo: a fluke, not a pattern

    def breaks(prompts, completions, **_):
        raise RuntimeError("no")

    manager = RewardManager([exact, pays_long, pays_echo_of_zero, breaks])
    prompts = ["1+2=", "0+4=", "5+5=", "3+3="]
    result = probe_rewards(_scorer(manager), manager.names, prompts, {"answer": ["3", "4", "10", "6"]},
                           max_new_tokens=8)
    assert result.prompts == 4
    assert result.paid["exact"] == {"empty": 0, "echo": 0, "repeat": 0}
    # lengths: empty 0 -> 0; echo 4 characters -> 4/8; repeat at the limit -> 8/8
    assert result.mean["pays_long"] == {"empty": 0.0, "echo": 0.5, "repeat": 1.0}
    assert result.paid["pays_long"] == {"empty": 0, "echo": 4, "repeat": 4}
    assert result.paid["pays_echo_of_zero"]["echo"] == 1
    assert result.flagged == {"pays_long": ["echo", "repeat"]}  # paid on >= half the prompts
    assert result.failed["breaks"].startswith("RewardError: reward function 'breaks' raised RuntimeError: no")
    assert result.to_json()["flagged"] == {"pays_long": ["echo", "repeat"]}


def test_probe_of_a_weighted_spec_reports_unweighted_scores():
    def one(prompts, completions, **_):
        return [1.0] * len(completions)

    manager = RewardManager([RewardSpec(one, weight=0.1)])
    result = probe_rewards(_scorer(manager), manager.names, ["a", "b"], {}, max_new_tokens=2)
    assert result.mean["one"] == {"empty": 1.0, "echo": 1.0, "repeat": 1.0}
    assert result.flagged == {"one": list(ADVERSARIAL_KINDS)}


def test_probe_adds_the_fields_that_depend_on_the_completion():
    def pays_its_label(prompts, completions, *, label, **_):
        return [float(x == "empty") for x in label]

    asked = []

    def labels(owner, completions):  # e.g. a multi-turn run's `episode` record of each row
        asked.append((list(owner), list(completions)))
        return {"label": ["empty" if c == "" else "other" for c in completions]}

    manager = RewardManager([pays_its_label])
    result = probe_rewards(_scorer(manager), manager.names, ["a", "b"], {}, max_new_tokens=2,
                           completion_fields=labels)
    assert asked == [([0, 0, 0, 1, 1, 1], ["", "a", "the the ", "", "b", "the the "])]  # once, every row
    assert result.mean["pays_its_label"] == {"empty": 1.0, "echo": 0.0, "repeat": 0.0}
    assert result.flagged == {"pays_its_label": ["empty"]} and result.failed == {}


def test_a_restored_auditor_goes_on_as_if_it_had_not_stopped():
    step = dict(total=[0.0] * 4, per_function={"right": [0.0] * 4}, weights={"right": 1.0}, lengths=[3] * 4,
                finished=[True] * 4, group_size=2)
    lines = []
    straight = RewardAuditor(AuditLimits(constant_steps=2), log=lines.append)
    for n in (1, 2):
        straight(step=n, **step)
    saved = straight.state_json()
    assert saved == {"streaks": {"right": 2}, "warned": ["constant_groups/right"]}
    resumed = RewardAuditor(AuditLimits(constant_steps=2), log=lines.append)
    resumed.restore_json(json.loads(json.dumps(saved)))  # through a checkpoint's JSON
    assert resumed(step=3, **step) == straight(step=3, **step)  # streak 3 in both
    assert len(lines) == 1  # warned at step 2, not again after the resume
    fresh = RewardAuditor()
    fresh.restore_json({})  # a checkpoint from before the audits
    assert fresh(step=1, **step)["reward_audit/constant_groups_steps/right"] == 1.0
