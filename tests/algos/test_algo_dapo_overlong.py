"""DAPO's soft overlong punishment, in tokens, at the edges of its buffer."""

import dataclasses

import numpy as np
import pytest
from flax import nnx

import rewards
import rl_models
from algo_dapo import DAPOConfig, DAPOLearner, OverlongConfig, overlong_penalty, overlong_shaping
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.testing import BagPolicy, make_groups


# L_max = 20, L_cache = 4: the buffer starts at L_max - L_cache = 16.
#   |y| <= 16       -> 0
#   16 < |y| <= 20  -> (16 - |y|) / 4
#   |y| > 20        -> -1
@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (0, 0.0),
        (1, 0.0),
        (16, 0.0),  # L_max - L_cache: last length without penalty
        (17, -0.25),  # (16 - 17) / 4
        (18, -0.5),  # (16 - 18) / 4, mid-buffer
        (19, -0.75),
        (20, -1.0),  # L_max: (16 - 20) / 4
        (21, -1.0),  # beyond
        (1000, -1.0),
    ],
)
def test_shaping_at_the_edges(length, expected):
    assert overlong_shaping(length, max_tokens=20, cache_tokens=4) == expected


def test_cache_equal_to_max_ramps_from_zero_length():
    # L_max = L_cache = 4: start 0; |y| = 1 -> -1/4, 2 -> -2/4, 4 -> -1, 5 -> -1.
    shaped = [overlong_shaping(n, max_tokens=4, cache_tokens=4) for n in (0, 1, 2, 4, 5)]
    assert shaped == [0.0, -0.25, -0.5, -1.0, -1.0]


def test_penalty_factor_scales_and_lengths_are_tokens_not_characters():
    fn = overlong_penalty(max_tokens=20, cache_tokens=4, penalty_factor=0.5)
    assert fn.__name__ == "overlong_penalty"
    # The texts are deliberately unrelated to the token counts: only completion_lengths counts.
    scores = fn(["p"] * 5, ["x" * 100, "", "abc", "x" * 19, "y"], completion_lengths=[16, 18, 20, 21, 3])
    # 0.5 * [0, -0.5, -1, -1, 0]
    assert scores == [0.0, -0.25, -0.5, -0.5, 0.0]


@pytest.mark.parametrize(("max_tokens", "cache_tokens"), [(20, 0), (20, -1), (20, 21)])
def test_bad_cache_tokens_raise(max_tokens, cache_tokens):
    rule = rf"cache_tokens = {cache_tokens}: must be in \(0, max_tokens = {max_tokens}\]"
    with pytest.raises(ValueError, match=rule):
        overlong_penalty(max_tokens=max_tokens, cache_tokens=cache_tokens)


def test_config_adds_one_function_with_the_default_cache():
    fns = DAPOConfig().reward_functions(max_new_tokens=20)
    assert len(fns) == 1 and fns[0].__name__ == "overlong_penalty"
    # default L_cache = 20 // 5 = 4, so 18 -> -0.5 (a cache of 5 would give -0.6, of 3 -2/3)
    assert fns[0](["p"] * 4, ["a"] * 4, completion_lengths=[16, 18, 20, 21]) == [0.0, -0.5, -1.0, -1.0]


def test_config_overrides_and_off_switch():
    assert DAPOConfig(overlong=OverlongConfig(enabled=False)).reward_functions(max_new_tokens=20) == ()
    # L_max = 10 from the config, cache 10 // 5 = 2: start 8; 9 -> -0.5; factor 2 -> -1.0.
    (fn,) = DAPOConfig(overlong=OverlongConfig(max_tokens=10, penalty_factor=2.0)).reward_functions(max_new_tokens=20)
    assert fn(["p"] * 3, ["a"] * 3, completion_lengths=[8, 9, 10]) == [0.0, -1.0, -2.0]
    # tiny L_max: 4 // 5 = 0, clamped to 1; start 3: 3 -> 0, 4 -> -1.
    (fn,) = DAPOConfig().reward_functions(max_new_tokens=4)
    assert fn(["p"] * 2, ["a"] * 2, completion_lengths=[3, 4]) == [0.0, -1.0]
    # explicit cache
    (fn,) = DAPOConfig(overlong=OverlongConfig(cache_tokens=8)).reward_functions(max_new_tokens=20)
    assert fn(["p"] * 2, ["a"] * 2, completion_lengths=[12, 16]) == [0.0, -0.5]


def never_correct(prompts, completions, **_):
    return [0.0] * len(completions)


def test_learner_adds_overlong_shaping_to_a_plain_manager_and_scores_token_lengths():
    """A DAPOLearner built from the library applies the shaping itself; `completion_lengths`
    comes from Groups.lengths (tokens), never from characters."""
    tok = rl_models.CharTokenizer()
    config = DAPOConfig(group_size=2)
    manager = rewards.RewardManager([never_correct])
    learner = DAPOLearner(
        config,
        policy=BagPolicy(tok.vocab_size, rngs=nnx.Rngs(0)),
        tokenizer=tok,
        train_data=[Prompt("1")],
        training=TrainingConfig(prompts_per_step=2),
        rollout=RolloutConfig(max_new_tokens=20),
        reward_manager=manager,
    )
    groups = make_groups(
        [Prompt("a"), Prompt("b")],
        [0, 0, 0, 0],
        group_size=2,
        completion_tokens=np.full((4, 20), 7),
        lengths=[16, 18, 20, 5],
        texts=["", "", "", "x" * 50],  # characters would say otherwise
    )
    scored = learner._score(groups)
    assert manager.names == ("never_correct",)  # the caller's manager is unchanged
    assert learner.reward_manager.names == ("never_correct", "overlong_penalty")
    np.testing.assert_array_equal(scored.rewards, np.asarray([0.0, -0.5, -1.0, 0.0], np.float32))
    np.testing.assert_array_equal(scored.reward_scores["overlong_penalty"], [0.0, -0.5, -1.0, 0.0])
    np.testing.assert_array_equal(scored.reward_scores["never_correct"], [0.0] * 4)


def test_zero_of_four_correct_with_one_overlong_answer_is_uniform_by_correctness_not_by_total():
    # The case: 0 of 4 correct, one answer overlong -> totals [0, 0, 0, -1].
    groups = make_groups(
        [Prompt("a")], [0.0, 0.0, 0.0, -1.0], group_size=4, completion_tokens=np.full((4, 20), 7), lengths=[5, 6, 7, 21]
    )
    groups = dataclasses.replace(
        groups,
        reward_scores={"numeric_answer": np.zeros(4, np.float32), "overlong_penalty": np.asarray([0, 0, 0, -1.0])},
    )
    assert groups.uniform("numeric_answer").tolist() == [True]  # DAPO's default: dropped
    assert groups.uniform("total").tolist() == [False]  # what the total alone would keep


def test_a_manager_that_already_holds_the_overlong_penalty_is_refused_with_the_reason():
    tok = rl_models.CharTokenizer()
    config = DAPOConfig(group_size=2)
    with pytest.raises(ValueError, match=r"already holds \['overlong_penalty'\]: DAPOLearner adds .* itself"):
        DAPOLearner(
            config,
            policy=BagPolicy(tok.vocab_size, rngs=nnx.Rngs(0)),
            tokenizer=tok,
            train_data=[Prompt("1")],
            training=TrainingConfig(prompts_per_step=2),
            rollout=RolloutConfig(max_new_tokens=20),
            reward_manager=rewards.RewardManager([never_correct, *config.reward_functions(max_new_tokens=20)]),
        )
