"""GDPO's advantage estimator (arXiv:2601.05242): each reward function's scores normalised
within the group, summed by weight, then normalised over the batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core import registry
from rl_core.math.advantages import GRPO_STD_EPS, gdpo_advantages, grpo_advantages, takes_reward_scores
from tolerances import close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, lambda f: jax.jit(f, static_argnums=1)],
                                   ids=["eager", "jit"])


def reference_gdpo(rewards_per_func: np.ndarray, weights: np.ndarray, num_generations: int, eps: float) -> np.ndarray:
    """A literal transcription, in float64 numpy, of the authors' TRL code (NVlabs/GDPO README,
    "trl GDPO Implementation"); rewards_per_func is [N, K] as there, eps their 1e-4 made a parameter."""
    rewards_per_func_filter = np.nan_to_num(rewards_per_func)
    all_reward_advantage = []
    for i in range(len(weights)):
        reward_i = rewards_per_func_filter[:, i]
        each_reward_mean_grouped = reward_i.reshape(-1, num_generations).mean(axis=1)
        each_reward_std_grouped = reward_i.reshape(-1, num_generations).std(axis=1, ddof=1)
        each_reward_mean_grouped = np.repeat(each_reward_mean_grouped, num_generations)
        each_reward_std_grouped = np.repeat(each_reward_std_grouped, num_generations)
        each_reward_advantage = reward_i - each_reward_mean_grouped
        each_reward_advantage = each_reward_advantage / (each_reward_std_grouped + eps)
        all_reward_advantage.append(each_reward_advantage)
    combined_reward_advantage = np.stack(all_reward_advantage, axis=1)
    pre_bn_advantages = np.nansum(combined_reward_advantage * weights[None, :], axis=1)
    bn_advantages_mean = pre_bn_advantages.mean()
    bn_advantages_std = pre_bn_advantages.std(ddof=1)
    return (pre_bn_advantages - bn_advantages_mean) / (bn_advantages_std + eps)


def test_registered_and_marked_for_per_function_scores():
    fn = registry.get("advantage_estimator", "gdpo")
    assert fn is gdpo_advantages and takes_reward_scores(fn)
    assert not takes_reward_scores(registry.get("advantage_estimator", "grpo"))


@VARIANTS
@pytest.mark.parametrize("seed", range(5))
def test_one_reward_without_the_batch_step_is_grpo_exactly(variant, seed):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=24).astype(np.float32)
    rewards[8:12] = 0.5  # a tied group
    rewards[12:16] = rng.integers(0, 2, size=4)  # binary
    # the same way both: a jitted program's rounding may differ from op-by-op's by an ulp
    grpo = np.asarray(variant(grpo_advantages)(jnp.asarray(rewards), 4))

    def gdpo(r, g, **kw):
        return gdpo_advantages(r, g, batch_normalize=False, **kw)

    # both with the total as the only reward and as one scoring function of weight 1
    assert np.array_equal(np.asarray(variant(gdpo)(jnp.asarray(rewards), 4)), grpo)
    one = variant(gdpo)(jnp.asarray(rewards), 4, scores=jnp.asarray(rewards[None]), weights=jnp.ones(1))
    assert np.array_equal(np.asarray(one), grpo)


@VARIANTS
def test_one_reward_with_the_batch_step_is_grpo_normalised_over_the_batch(variant):
    rewards = jnp.asarray([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 3.0, 1.0, 0.0, 0.0])
    grpo = np.asarray(grpo_advantages(rewards, 4), np.float64)
    expected = (grpo - grpo.mean()) / (grpo.std(ddof=1) + GRPO_STD_EPS)
    expected[4:8] = 0.0  # the tied group
    got = np.asarray(variant(gdpo_advantages)(rewards, 4))
    np.testing.assert_allclose(got, expected, **close(atol=1e-6))
    assert np.all(got[4:8] == 0.0)


@VARIANTS
def test_two_rewards_of_different_scales_by_hand(variant):
    # One group of 4: correctness in {0, 1} and a length score in {0, 10}, weights 1.
    correct = np.asarray([1.0, 1.0, 0.0, 0.0])
    length = np.asarray([0.0, 10.0, 0.0, 10.0])
    scores = jnp.asarray(np.stack([correct, length]), jnp.float32)
    got = np.asarray(variant(gdpo_advantages)(scores.sum(0), 4, scores=scores, weights=jnp.ones(2)))
    # Per function: centred +-0.5 and +-5, std(ddof=1) sqrt(1/3) and sqrt(100/3):
    a1 = 0.5 / (np.sqrt(1 / 3) + 1e-6)
    a2 = 5.0 / (np.sqrt(100 / 3) + 1e-6)  # both ~0.866: the scale is gone
    pre = np.asarray([a1 - a2, a1 + a2, -a1 - a2, -a1 + a2])  # sums to 0: batch mean 0
    expected = pre / (np.sqrt(np.sum(pre**2) / 3) + 1e-6)
    np.testing.assert_allclose(got, expected, **close(rtol=1e-5, atol=1e-6))
    np.testing.assert_allclose(got, [0.0, np.sqrt(1.5), -np.sqrt(1.5), 0.0], **close(atol=1e-4))
    # GRPO on the total [1, 11, 0, 10] lets the length score decide: the short correct answer
    # gets a negative advantage and the long wrong one a positive one.
    grpo = np.asarray(grpo_advantages(scores.sum(0), 4))
    assert grpo[0] < 0 < grpo[3]


def test_weights_scale_each_function_before_the_sum():
    scores = jnp.asarray([[1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0],
                          [0.0, 10.0, 0.0, 10.0, 4.0, 4.0, 4.0, 8.0]])  # fmt: skip
    weights = jnp.asarray([2.0, 0.5])
    got = gdpo_advantages(scores.sum(0), 4, scores=scores, weights=weights, batch_normalize=False)
    expected = 2.0 * np.asarray(grpo_advantages(scores[0], 4)) + 0.5 * np.asarray(grpo_advantages(scores[1], 4))
    np.testing.assert_allclose(np.asarray(got), expected, **close(rtol=1e-6))


@VARIANTS
@pytest.mark.parametrize("seed", range(6))
def test_against_the_reference_code_on_random_scores(variant, seed):
    rng = np.random.default_rng(seed)
    k, groups, g = int(rng.integers(1, 4)), int(rng.integers(1, 6)), int(rng.integers(2, 9))
    if seed % 2:
        per_func = rng.normal(size=(groups * g, k)) * rng.uniform(0.1, 10.0, size=k)  # continuous, scales apart
    else:
        per_func = rng.integers(0, 3, size=(groups * g, k)).astype(np.float64)  # ties and tied groups
    weights = rng.uniform(0.1, 2.0, size=k)
    expected = reference_gdpo(per_func, weights, g, eps=GRPO_STD_EPS)
    scores = jnp.asarray(per_func.T, jnp.float32)
    total = jnp.asarray(per_func @ weights, jnp.float32)
    got = np.asarray(variant(gdpo_advantages)(total, g, scores=scores, weights=jnp.asarray(weights, jnp.float32)))
    np.testing.assert_allclose(got, expected, **close(rtol=1e-6, atol=1e-6))


def test_a_group_with_no_signal_in_any_function_gets_exactly_zero():
    scores = jnp.asarray([[1.0, 1.0, 1.0, 0.0, 1.0, 0.0],
                          [0.3, 0.3, 0.3, 0.2, 0.9, 0.1]])  # fmt: skip
    got = np.asarray(gdpo_advantages(scores.sum(0), 3, scores=scores))
    assert np.all(got[:3] == 0.0) and np.all(got[3:] != 0.0)
    # a tied total whose functions disagree is not such a group: GDPO keeps its signal
    split = jnp.asarray([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    assert np.all(np.asarray(grpo_advantages(split.sum(0), 2)) == 0.0)
    assert np.all(np.asarray(gdpo_advantages(split.sum(0), 2, scores=split, weights=jnp.asarray([2.0, 1.0]))) != 0.0)


def test_bad_shapes_fail_loudly():
    with pytest.raises(ValueError, match=r"scores must be \[K, B\]"):
        gdpo_advantages(jnp.zeros(4), 2, scores=jnp.zeros((2, 6)))
    with pytest.raises(ValueError, match=r"weights must be \[K\]"):
        gdpo_advantages(jnp.zeros(4), 2, scores=jnp.zeros((2, 4)), weights=jnp.ones(3))
    with pytest.raises(ValueError, match="multiple of group_size"):
        gdpo_advantages(jnp.zeros(5), 2)
