"""rl_core.math.advantages: hand-computed GRPO / RLOO advantages, with and without jit, under vmap."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core import registry
from rl_core.math.advantages import grpo_advantages, rloo_advantages, uniform_groups
from tolerances import close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])


def _grpo(variant, rewards, group_size):
    return variant(functools.partial(grpo_advantages, group_size=group_size))(jnp.asarray(rewards, jnp.float32))


def _rloo(variant, rewards, group_size):
    return variant(functools.partial(rloo_advantages, group_size=group_size))(jnp.asarray(rewards, jnp.float32))


# [1, 0, 0, 1]: mean 0.5; deviations +-0.5; var(ddof=1) = 4 * 0.25 / 3 = 1/3;
# std = sqrt(1/3) = 0.5773503; A = +-0.5 / (0.5773503 + 1e-6) = +-0.8660239.
HALF_OVER_STD = 0.5 / (math.sqrt(1 / 3) + 1e-6)


@VARIANTS
def test_grpo_one_group(variant):
    adv = _grpo(variant, [1.0, 0.0, 0.0, 1.0], 4)
    np.testing.assert_allclose(adv, [0.866024, -0.866024, -0.866024, 0.866024], **close(atol=1e-5))
    np.testing.assert_allclose(adv, [HALF_OVER_STD, -HALF_OVER_STD, -HALF_OVER_STD, HALF_OVER_STD], **close(atol=1e-6))


@VARIANTS
def test_grpo_two_groups_are_independent(variant):
    # Group 1 as above. Group 2 [2, 0, 0, 0]: mean 0.5; deviations 1.5, -0.5 x3;
    # var(ddof=1) = (2.25 + 3 * 0.25) / 3 = 1; std = 1; A = 1.5/(1+1e-6), -0.5/(1+1e-6).
    adv = _grpo(variant, [1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0], 4)
    np.testing.assert_allclose(
        adv, [0.866024, -0.866024, -0.866024, 0.866024, 1.4999985, -0.4999995, -0.4999995, -0.4999995],
            **close(atol=1e-5)
    )


@VARIANTS
@pytest.mark.parametrize("rewards", [[0.0] * 4, [1.0] * 4, [0.1] * 3, [0.7] * 5], ids=["zeros", "ones", "0.1x3", "0.7x5"])
def test_uniform_groups_get_exact_zero(variant, rewards):
    g = len(rewards)
    for fn in (_grpo, _rloo):
        adv = np.asarray(fn(variant, rewards, g))
        assert (adv == 0.0).all(), (fn.__name__, adv)


@VARIANTS
def test_uniform_group_next_to_informative_group(variant):
    # First group uniform -> exact zeros; second group [1, 0] -> G=2 case below.
    adv = np.asarray(_grpo(variant, [0.1, 0.1, 1.0, 0.0], 2))
    assert (adv[:2] == 0.0).all()
    np.testing.assert_allclose(adv[2:], [0.707106, -0.707106], **close(atol=1e-5))


@VARIANTS
def test_grpo_group_of_two(variant):
    # [1, 0]: mean 0.5; var(ddof=1) = 2 * 0.25 / 1 = 0.5; std = 0.7071068;
    # A = +-0.5 / 0.7071078 = +-0.7071058.
    adv = _grpo(variant, [1.0, 0.0], 2)
    np.testing.assert_allclose(adv, [0.707106, -0.707106], **close(atol=1e-5))


@VARIANTS
def test_rloo_one_group(variant):
    # [1, 0, 0, 1]: A_0 = 1 - (0+0+1)/3 = 2/3; A_1 = 0 - (1+0+1)/3 = -2/3.
    adv = _rloo(variant, [1.0, 0.0, 0.0, 1.0], 4)
    np.testing.assert_allclose(adv, [0.666667, -0.666667, -0.666667, 0.666667], **close(atol=1e-5))


@VARIANTS
def test_rloo_unequal_group(variant):
    # [3, 1, 2]: A_0 = 3 - 1.5 = 1.5; A_1 = 1 - 2.5 = -1.5; A_2 = 2 - 2 = 0.
    adv = _rloo(variant, [3.0, 1.0, 2.0], 3)
    np.testing.assert_allclose(adv, [1.5, -1.5, 0.0], **close(atol=1e-5))


def test_dr_grpo_relation():
    # Dr.GRPO's advantage r - mean(r), divided by (std(ddof=1) + 1e-6), is GRPO's.
    rewards = np.array([0.3, 1.0, 0.0, 0.5, 2.0, -1.0], np.float32)
    groups = rewards.reshape(-1, 3)
    dr_grpo = groups - groups.mean(axis=1, keepdims=True)
    std = groups.std(axis=1, ddof=1, keepdims=True)
    np.testing.assert_allclose((dr_grpo / (std + 1e-6)).reshape(-1), grpo_advantages(jnp.asarray(rewards), 3),
        **close(atol=1e-4))


def test_rloo_is_scaled_group_mean_baseline():
    # r_i - mean_{j!=i} r_j = G/(G-1) * (r_i - mean(r)): a relation, not the code's formula.
    rewards = np.array([0.3, 1.0, 0.0, 0.5], np.float32)
    np.testing.assert_allclose(rloo_advantages(jnp.asarray(rewards), 4), 4 / 3 * (rewards - rewards.mean()),
        **close(atol=1e-5))


def test_vmap_over_batches():
    # Two independent batches of one group each; each row as in the tests above.
    rewards = jnp.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    adv = jax.vmap(functools.partial(grpo_advantages, group_size=4))(rewards)
    np.testing.assert_allclose(adv[0], [0.866024, -0.866024, -0.866024, 0.866024], **close(atol=1e-5))
    assert (np.asarray(adv[1]) == 0.0).all()
    flags = jax.vmap(functools.partial(uniform_groups, group_size=2))(rewards)
    np.testing.assert_array_equal(flags, [[False, False], [True, True]])


@VARIANTS
def test_uniform_groups(variant):
    flags = variant(functools.partial(uniform_groups, group_size=3))(jnp.array([0.1, 0.1, 0.1, 1.0, 0.0, 1.0, 2.0, 2.0, 2.0]))
    assert flags.dtype == jnp.bool_
    np.testing.assert_array_equal(flags, [True, False, True])


def test_integer_rewards_are_promoted():
    adv = grpo_advantages(jnp.array([1, 0, 0, 1]), 4)
    assert jnp.issubdtype(adv.dtype, jnp.floating)
    np.testing.assert_allclose(adv, [0.866024, -0.866024, -0.866024, 0.866024], **close(atol=1e-5))


@pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages, uniform_groups])
def test_bad_shapes_raise(fn):
    with pytest.raises(ValueError, match=r"5.*group_size = 2"):
        fn(jnp.zeros(5), 2)
    with pytest.raises(ValueError, match="group_size must be >= 2.*got 1"):
        fn(jnp.zeros(4), 1)
    with pytest.raises(ValueError, match=r"1-D"):
        fn(jnp.zeros((2, 4)), 2)
    with pytest.raises(TypeError, match="Python int"):
        fn(jnp.zeros(4), 2.0)


def test_registry_finds_estimators():
    assert registry.get("advantage_estimator", "grpo") is grpo_advantages
    assert registry.get("advantage_estimator", "rloo") is rloo_advantages
