"""A reward function's own metrics (`Scores.metrics`, e.g. a judge's `time/judge`): summed by key
over the manager's functions, checked like scores."""

import pytest
from rewards import RewardError, RewardManager, RewardSpec, Scores


def judge_like(prompts, completions, **fields):
    return Scores([0.25] * len(completions), {"time/judge": 0.5, "rewards/judge/unparsed": 1})


def judge_too(prompts, completions, **fields):
    return Scores([1.0] * len(completions), {"time/judge": 0.25})


def plain(prompts, completions, **fields):
    return [1.0] * len(completions)


def test_function_metrics_are_summed_by_key_and_reported():
    manager = RewardManager([RewardSpec(judge_like, weight=2.0), judge_too, plain])
    result = manager.score(["p", "q"], ["a", "b"])
    assert result.total == (2.5, 2.5)  # 2 * 0.25 + 1 + 1
    assert result.function_metrics == {"time/judge": 0.75, "rewards/judge/unparsed": 1.0}
    assert result.metrics()["time/judge"] == 0.75


def test_plain_functions_report_no_metrics():
    assert RewardManager([plain]).score(["p"], ["a"]).function_metrics == {}


@pytest.mark.parametrize(("metrics", "problem"), [({"judge_seconds": 1.0}, "named 'judge_seconds'"),
                                                  ({"time/judge": float("nan")}, "not a finite number")])
def test_bad_function_metrics_name_the_function(metrics, problem):
    def bad(prompts, completions, **fields):
        return Scores([0.0] * len(completions), metrics)

    with pytest.raises(RewardError, match=problem) as info:
        RewardManager([bad]).score(["p"], ["a"])
    assert info.value.function == "bad"
