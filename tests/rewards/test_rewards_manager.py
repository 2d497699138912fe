"""RewardManager: weighting, fields by name, metrics, failure modes, thread pool, input checks."""

import math

import pytest

from rewards import REWARD_FUNCTIONS, RewardError, RewardManager, RewardResult, RewardSpec, make_reward
from rewards import format_reward, gsm8k_reward, length_penalty, numeric_answer

PROMPTS = ["p0", "p1", "p2", "p3"]
COMPLETIONS = ["#### 4", "#### 5", "no answer", "#### 7"]
ANSWERS = ["4", "5", "6", "8"]


def constant(value, name):
    def fn(prompts, completions, **_):
        return [value] * len(completions)

    fn.__name__ = name
    return fn


def test_weighted_combination_and_per_function_scores():
    manager = RewardManager([RewardSpec(gsm8k_reward, weight=2.0), RewardSpec(constant(0.5, "half"), weight=-1.0)])
    result = manager.score(PROMPTS, COMPLETIONS, {"answer": ANSWERS})
    assert result.per_function == {"gsm8k": (1.0, 1.0, 0.0, 0.0), "half": (0.5, 0.5, 0.5, 0.5)}
    # total = 2 * gsm8k - 1 * 0.5
    assert result.total == (1.5, 1.5, -0.5, -0.5)
    assert result.num_failed == 0 and result.errors == ()


def test_metrics_are_hand_computed():
    manager = RewardManager([gsm8k_reward, RewardSpec(constant(-0.25, "neg"), weight=2.0)])
    metrics = manager.score(PROMPTS, COMPLETIONS, {"answer": ANSWERS}).metrics()
    # totals: 1 - 0.5 = 0.5 twice, 0 - 0.5 = -0.5 twice; mean 0, population std 0.5
    assert metrics == pytest.approx(
        {
            "rewards/gsm8k/mean": 0.5,
            "rewards/gsm8k/frac_positive": 0.5,
            "rewards/neg/mean": -0.25,
            "rewards/neg/frac_positive": 0.0,
            "rewards/total/mean": 0.0,
            "rewards/total/std": 0.5,
            "rewards/failed": 0.0,
        },
        abs=1e-12,
    )


def test_fields_are_passed_by_name_and_functions_take_only_what_they_need():
    seen = {}

    def spy(prompts, completions, *, target, **rest):
        seen.update(prompts=prompts, completions=completions, target=target, rest=rest)
        return [float(t) for t in target]

    manager = RewardManager([spy, format_reward(), numeric_answer])
    fields = {"target": [1, 2, 3, 4], "answer": ["4", "5", "6", "7"]}
    result = manager.score(PROMPTS, COMPLETIONS, fields)
    assert result.per_function["spy"] == (1.0, 2.0, 3.0, 4.0)
    assert result.per_function["numeric_answer"] == (1.0, 1.0, 0.0, 1.0)
    assert seen == {
        "prompts": PROMPTS,
        "completions": COMPLETIONS,
        "target": [1, 2, 3, 4],
        "rest": {"answer": fields["answer"]},
    }


def test_functions_get_copies_so_they_cannot_change_the_callers_lists():
    def vandal(prompts, completions, *, answer, **_):
        completions[0] = "changed"
        answer.clear()
        return [0.0] * len(prompts)

    completions, answers = list(COMPLETIONS), list(ANSWERS)
    result = RewardManager([vandal, gsm8k_reward]).score(PROMPTS, completions, {"answer": answers})
    assert (completions, answers) == (COMPLETIONS, ANSWERS)
    assert result.per_function["gsm8k"] == (1.0, 1.0, 0.0, 0.0)


def test_specs_are_not_mutated_and_plain_callables_are_wrapped():
    specs = [gsm8k_reward, RewardSpec(constant(1.0, "one"), weight=0.5, name="bonus")]
    manager = RewardManager(specs)
    assert specs[0] is gsm8k_reward and len(specs) == 2
    assert manager.specs == (RewardSpec(gsm8k_reward, 1.0, "gsm8k"), RewardSpec(specs[1].fn, 0.5, "bonus"))
    assert manager.names == ("gsm8k", "bonus")


def test_duplicate_names_raise():
    with pytest.raises(ValueError, match="two reward functions are named 'gsm8k'"):
        RewardManager([gsm8k_reward, RewardSpec(gsm8k_reward, weight=2.0)])
    RewardManager([gsm8k_reward, RewardSpec(gsm8k_reward, weight=2.0, name="gsm8k_again")])  # renamed: fine


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"on_error": "ignore"}, "on_error must be one of"),
        ({"max_workers": 0}, "max_workers"),
        ({"max_workers": 2.0}, "max_workers"),
    ],
)
def test_constructor_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardManager([gsm8k_reward], **kwargs)


def test_spec_validation():
    with pytest.raises(ValueError, match="needs a name"):
        RewardSpec(lambda prompts, completions, **_: [0.0] * len(completions))
    with pytest.raises(ValueError, match="weight"):
        RewardSpec(gsm8k_reward, weight=float("nan"))
    with pytest.raises(TypeError, match="callable"):
        RewardSpec("gsm8k")
    with pytest.raises(ValueError, match="at least one"):
        RewardManager([])


def raises(prompts, completions, **_):
    raise ZeroDivisionError("boom")


def wrong_count(prompts, completions, **_):
    return [1.0] * (len(completions) - 1)


def not_a_list(prompts, completions, **_):
    return 1.0


def nan_at_2(prompts, completions, **_):
    return [0.0, 0.0, math.nan, 0.0]


def inf_at_1(prompts, completions, **_):
    return [0.0, -math.inf, 0.0, 0.0]


def string_at_3(prompts, completions, **_):
    return [0.0, 0.0, 0.0, "1.0"]


LONG = "x" * 200 + "THE END"
HOSTILE_COMPLETIONS = ["#### 4", "#### 5", "no answer", LONG]


@pytest.mark.parametrize(
    ("fn", "match", "index"),
    [
        (raises, r"'raises' raised ZeroDivisionError: boom \(on a batch of 4 completions\)", None),
        (wrong_count, "'wrong_count' returned 3 scores for 4 completions", None),
        (not_a_list, r"'not_a_list' returned 1.0 \(not a list\) for 4 completions", None),
        (nan_at_2, "'nan_at_2' returned a non-finite score nan for completion 2: 'no answer'", 2),
        (inf_at_1, "'inf_at_1' returned a non-finite score -inf for completion 1: '#### 5'", 1),
        (string_at_3, r"'string_at_3' returned a non-number '1.0' \(str\) for completion 3: 'xxx", 3),
    ],
)
def test_each_failure_raises_a_reward_error_naming_function_index_and_completion(fn, match, index):
    manager = RewardManager([gsm8k_reward, fn])
    with pytest.raises(RewardError, match=match) as info:
        manager.score(PROMPTS, HOSTILE_COMPLETIONS, {"answer": ANSWERS})
    error = info.value
    assert isinstance(error, ValueError)
    assert (error.function, error.index) == (fn.__name__, index)
    if index == 3:  # the long completion is shortened to 80 characters, shown with repr
        assert error.completion == repr("x" * 77 + "...")
        assert "THE END" not in str(error)


def test_a_raising_function_chains_its_exception():
    with pytest.raises(RewardError) as info:
        RewardManager([raises]).score(PROMPTS, COMPLETIONS)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize(
    ("fn", "expected_scores", "num_failed"),
    [
        (raises, (0.0, 0.0, 0.0, 0.0), 4),  # the whole call failed: every sample counts
        (wrong_count, (0.0, 0.0, 0.0, 0.0), 4),
        (nan_at_2, (0.0, 0.0, 0.0, 0.0), 1),
        (inf_at_1, (0.0, 0.0, 0.0, 0.0), 1),
        (string_at_3, (0.0, 0.0, 0.0, 0.0), 1),
    ],
)
def test_on_error_zero_scores_zero_and_counts(fn, expected_scores, num_failed):
    manager = RewardManager([gsm8k_reward, RewardSpec(fn, weight=3.0)], on_error="zero")
    result = manager.score(PROMPTS, HOSTILE_COMPLETIONS, {"answer": ANSWERS})
    assert result.per_function[fn.__name__] == expected_scores
    assert result.per_function["gsm8k"] == (1.0, 1.0, 0.0, 0.0)
    assert result.total == (1.0, 1.0, 0.0, 0.0)  # failed scores add 0 whatever the weight
    assert result.num_failed == num_failed
    assert all(isinstance(error, RewardError) and error.function == fn.__name__ for error in result.errors)
    assert result.metrics()["rewards/failed"] == num_failed


def test_on_error_zero_keeps_the_good_scores_of_a_partly_bad_function():
    def partly_nan(prompts, completions, **_):
        return [0.5, math.nan, 0.25, math.inf]

    result = RewardManager([partly_nan], on_error="zero").score(PROMPTS, COMPLETIONS)
    assert result.per_function["partly_nan"] == (0.5, 0.0, 0.25, 0.0)
    assert result.num_failed == 2
    assert [error.index for error in result.errors] == [1, 3]


def test_thread_pool_gives_identical_results():
    specs = [
        gsm8k_reward,
        RewardSpec(numeric_answer, weight=0.5),
        RewardSpec(format_reward(strict=False), weight=0.25),
        RewardSpec(length_penalty(max_chars=6, buffer_chars=2), weight=2.0),
        RewardSpec(nan_at_2, weight=3.0),
    ]
    fields = {"answer": ANSWERS}
    sequential = RewardManager(specs, on_error="zero").score(PROMPTS, COMPLETIONS, fields)
    pooled = RewardManager(specs, on_error="zero", max_workers=4).score(PROMPTS, COMPLETIONS, fields)
    assert pooled.total == sequential.total
    assert pooled.per_function == sequential.per_function
    assert list(pooled.per_function) == list(sequential.per_function)
    assert pooled.num_failed == sequential.num_failed == 1
    assert pooled.metrics() == sequential.metrics()


def test_thread_pool_raises_the_same_first_error():
    manager = RewardManager([gsm8k_reward, wrong_count, raises], max_workers=3)
    with pytest.raises(RewardError, match="'wrong_count' returned 3 scores"):
        manager.score(PROMPTS, COMPLETIONS, {"answer": ANSWERS})


@pytest.mark.parametrize(
    ("prompts", "fields", "match"),
    [
        (PROMPTS, {"answer": ANSWERS[:3]}, "field 'answer' has 3 entries for 4 completions"),
        (PROMPTS, {"answer": ANSWERS, "target": [1] * 5}, "field 'target' has 5 entries for 4 completions"),
        (PROMPTS, {"answer": "4567"}, "field 'answer' must be a list"),
        (PROMPTS, {"prompts": ANSWERS}, "field name 'prompts'"),
        (PROMPTS[:3], {"answer": ANSWERS}, "got 3 prompts for 4 completions"),
    ],
)
def test_inputs_are_validated_naming_the_culprit(prompts, fields, match):
    with pytest.raises(ValueError, match=match):
        RewardManager([gsm8k_reward]).score(prompts, COMPLETIONS, fields)


def test_non_string_completion_and_empty_batch_are_rejected():
    with pytest.raises(ValueError, match=r"completions\[1\] is NoneType"):
        RewardManager([gsm8k_reward]).score(["p", "p"], ["#### 1", None], {"answer": ["1", "1"]})
    with pytest.raises(ValueError, match="at least one completion"):
        RewardManager([gsm8k_reward]).score([], [], {"answer": []})


def test_a_missing_field_is_reported_with_the_function_name():
    with pytest.raises(RewardError, match=r"'gsm8k' raised TypeError: .*'answer'"):
        RewardManager([gsm8k_reward]).score(PROMPTS, COMPLETIONS, {})


def test_result_is_frozen():
    result = RewardManager([gsm8k_reward]).score(PROMPTS, COMPLETIONS, {"answer": ANSWERS})
    assert isinstance(result, RewardResult)
    with pytest.raises(AttributeError):
        result.total = ()


def test_registry_builds_every_reward_with_its_name_and_defaults():
    assert sorted(REWARD_FUNCTIONS) == [  # the entry points this package declares (rewards.functions)
        "boxed",
        "countdown",
        "episode_reward",
        "format_lenient",
        "format_strict",
        "gsm8k",
        "length_penalty",
        "math_verify",
        "numeric_answer",
        "remote_judge",
        "remote_score",
    ]
    for name, factory in REWARD_FUNCTIONS.items():
        if name.startswith("remote_"):
            continue  # they need a url: tests/rewards/test_rewards_remote.py
        fn = factory()
        assert fn.__name__ == name
        assert fn.__doc__
    assert make_reward("countdown", wrong_format_score=0.0).__name__ == "countdown"
    assert make_reward("format_strict", answer_tag="final")(["p"], ["<think></think><final>1</final>"]) == [1.0]


def test_registry_is_read_only_and_unknown_names_say_what_exists():
    with pytest.raises(TypeError):
        REWARD_FUNCTIONS["mine"] = gsm8k_reward
    with pytest.raises(ValueError, match=r"unknown reward function 'gsm8kk'; known: boxed, .*mean 'gsm8k'\? Your own: 'module:function'"):
        make_reward("gsm8kk")
    with pytest.raises(TypeError, match="gsm8k"):
        make_reward("gsm8k", strict=True)


def test_numpy_scores_and_fields_are_accepted_without_rewards_needing_numpy():
    np = pytest.importorskip("numpy")

    def as_array(prompts, completions, *, target, **_):
        return np.asarray(target, dtype=np.float32) / 2

    result = RewardManager([as_array]).score(PROMPTS, COMPLETIONS, {"target": np.arange(4)})
    assert result.per_function["as_array"] == (0.0, 0.5, 1.0, 1.5)
    assert all(type(score) is float for score in result.total)


class Abort(BaseException):
    """A BaseException that is not one of Python's own."""


def exits(prompts, completions, **_):
    raise SystemExit(3)


def aborts(prompts, completions, **_):
    raise Abort("no")


def interrupted(prompts, completions, **_):
    raise KeyboardInterrupt


@pytest.mark.parametrize("max_workers", [None, 2])
@pytest.mark.parametrize(
    ("fn", "match"),
    [(exits, r"'exits' raised SystemExit: 3 \(on a batch of 4 completions\)"), (aborts, r"'aborts' raised Abort: no")],
)
def test_a_base_exception_from_a_reward_is_a_reward_error_naming_it(fn, match, max_workers):
    # SystemExit from a reward once ended training with exit 3 and no word about which function
    manager = RewardManager([gsm8k_reward, fn], max_workers=max_workers)
    with pytest.raises(RewardError, match=match) as info:
        manager.score(PROMPTS, HOSTILE_COMPLETIONS, {"answer": ANSWERS})
    assert info.value.function == fn.__name__
    result = RewardManager([gsm8k_reward, fn], on_error="zero").score(PROMPTS, HOSTILE_COMPLETIONS, {"answer": ANSWERS})
    assert result.num_failed == 4 and result.per_function[fn.__name__] == (0.0,) * 4


def test_ctrl_c_inside_a_reward_still_stops():
    with pytest.raises(KeyboardInterrupt):
        RewardManager([interrupted]).score(PROMPTS, COMPLETIONS)
