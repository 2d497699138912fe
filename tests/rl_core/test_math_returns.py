"""rl_core.math.returns: token rewards, GAE against a NumPy loop, whitening, explained variance.

GAE is checked against the textbook recursion written as a plain loop over each row's
real tokens (CleanRL's "vectorised vs loop" check), on random right-padded batches, and
against its two closed forms: lambda = 1 is the discounted reward-to-go minus V, lambda = 0
the one-step TD error. Every function runs eagerly, under jit and under vmap.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core import registry
from rl_core.protocols import check_signature
from rl_core.math.returns import explained_variance, gae, gae_advantages, token_rewards, whiten
from tolerances import approx, close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])


def mask_of(lengths, t):
    return (np.arange(t)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)


def gae_loop(rewards, values, lengths, gamma, lam):
    """The recursion over each row's real tokens 0..n-1, V_n = 0 (the episode ended)."""
    adv = np.zeros_like(rewards, dtype=np.float64)
    for i, n in enumerate(lengths):
        running = 0.0
        for t in reversed(range(n)):
            next_value = values[i, t + 1] if t + 1 < n else 0.0
            delta = rewards[i, t] + gamma * next_value - values[i, t]
            running = delta + gamma * lam * running
            adv[i, t] = running
    return adv, np.where(mask_of(lengths, rewards.shape[1]) > 0, adv + values, 0.0)


def random_batch(seed, b=6, t=7):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, t + 1, b)  # empty rows and full rows included
    lengths[0], lengths[1] = 0, t
    mask = mask_of(lengths, t)
    # garbage at masked positions: it must not leak into any real token
    rewards = np.where(mask > 0, rng.normal(size=(b, t)), 1e3).astype(np.float32)
    values = np.where(mask > 0, rng.normal(size=(b, t)), -1e3).astype(np.float32)
    return rewards, values, mask, lengths


@VARIANTS
@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0), (0.99, 0.0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_equals_the_loop_on_random_masked_batches(variant, gamma, lam, seed):
    rewards, values, mask, lengths = random_batch(seed)
    adv, returns = variant(functools.partial(gae, gamma=gamma, lam=lam))(rewards, values, mask)
    want_adv, want_returns = gae_loop(rewards, np.where(mask > 0, values, 0.0), lengths, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, **close(rtol=1e-5, atol=1e-5))
    np.testing.assert_allclose(returns, want_returns, **close(rtol=1e-5, atol=1e-5))
    assert not np.asarray(adv)[mask == 0].any() and not np.asarray(returns)[mask == 0].any()


def reward_to_go_minus_value(r, v, n, t, gamma):
    return sum(gamma ** (k - t) * r[k] for k in range(t, n)) - v[t]


def one_step_td_error(r, v, n, t, gamma):
    return r[t] + gamma * (v[t + 1] if t + 1 < n else 0.0) - v[t]


@VARIANTS
@pytest.mark.parametrize(("lam", "closed_form"), [(1.0, reward_to_go_minus_value), (0.0, one_step_td_error)],
                         ids=["lambda=1", "lambda=0"])
def test_lambda_one_and_zero_have_their_closed_forms(variant, lam, closed_form):
    rewards, values, mask, lengths = random_batch(3)
    adv, _ = variant(functools.partial(gae, gamma=0.9, lam=lam))(rewards, values, mask)
    for i, n in enumerate(lengths):
        for t in range(n):
            assert adv[i, t] == approx(closed_form(rewards[i], values[i], n, t, 0.9), abs=1e-4)


def test_gae_by_hand():
    # One row of 3 real tokens and a pad, reward 1 at the last token, V = [0.5, 0.6, 0.8, pad],
    # gamma = 1, lambda = 0.5:
    #   delta = [0 + 0.6 - 0.5, 0 + 0.8 - 0.6, 1 + 0 - 0.8] = [0.1, 0.2, 0.2]
    #   A_2 = 0.2; A_1 = 0.2 + 0.5 * 0.2 = 0.3; A_0 = 0.1 + 0.5 * 0.3 = 0.25
    #   returns = A + V = [0.75, 0.9, 1.0]
    adv, returns = gae(jnp.asarray([[0.0, 0.0, 1.0, 0.0]]), jnp.asarray([[0.5, 0.6, 0.8, 9.0]]),
                       jnp.asarray([[1.0, 1.0, 1.0, 0.0]]), gamma=1.0, lam=0.5)
    np.testing.assert_allclose(adv, [[0.25, 0.3, 0.2, 0.0]], **close(atol=1e-6))
    np.testing.assert_allclose(returns, [[0.75, 0.9, 1.0, 0.0]], **close(atol=1e-6))


def test_a_masked_position_inside_a_row_is_skipped():
    # Token 1 is masked (an observation inside an episode): the recursion carries V_2 and A_2
    # across it. Real tokens 0, 2 with V = [0.5, -, 0.8], reward 1 at token 2, gamma = 1, lambda = 1:
    #   A_2 = 1 - 0.8 = 0.2; A_0 = 0 + V_2 - V_0 + A_2 = 0.8 - 0.5 + 0.2 = 0.5 (= 1 - 0.5)
    adv, _ = gae(jnp.asarray([[0.0, 5.0, 1.0]]), jnp.asarray([[0.5, 7.0, 0.8]]), jnp.asarray([[1.0, 0.0, 1.0]]),
                 gamma=1.0, lam=1.0)
    np.testing.assert_allclose(adv, [[0.5, 0.0, 0.2]], **close(atol=1e-6))


def test_gae_under_vmap_equals_one_call_per_batch():
    batches = [random_batch(s) for s in (5, 6)]
    stacked = [np.stack(x) for x in zip(*(b[:3] for b in batches), strict=True)]
    adv, returns = jax.vmap(functools.partial(gae, gamma=0.95, lam=0.9))(*stacked)
    for k, (r, v, m, _) in enumerate(batches):
        one_adv, one_returns = gae(r, v, m, gamma=0.95, lam=0.9)
        np.testing.assert_allclose(adv[k], one_adv, **close(atol=1e-6))
        np.testing.assert_allclose(returns[k], one_returns, **close(atol=1e-6))


@VARIANTS
def test_token_rewards_put_the_reward_on_the_last_real_token_and_the_kl_on_every_one(variant):
    mask = np.asarray([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    kl = np.asarray([[0.1, -0.2, 0.3, 9.0], [0.5, 9.0, 9.0, 9.0], [9.0] * 4], np.float32)
    plain = variant(token_rewards)(np.asarray([2.0, -1.0, 3.0]), mask)
    np.testing.assert_array_equal(plain, [[0, 0, 2, 0], [-1, 0, 0, 0], [0, 0, 0, 0]])  # an empty row gets nothing
    # beta = 0.5: r_t = R [t = last] - 0.5 kl_t on real tokens: [-0.05, 0.1, 2 - 0.15, 0], [-1 - 0.25, 0, 0, 0]
    penalised = variant(functools.partial(token_rewards, beta=0.5))(np.asarray([2.0, -1.0, 3.0]), mask, kl=kl)
    np.testing.assert_allclose(penalised, [[-0.05, 0.1, 1.85, 0], [-1.25, 0, 0, 0], [0, 0, 0, 0]], **close(atol=1e-6))


def test_whiten_by_hand_and_zeros_stay_zero():
    # real tokens [1, 2, 3, 6]: mean 3, squared deviations 4 + 1 + 0 + 9 = 14, variance 14 / 3 (Bessel)
    x = jnp.asarray([[1.0, 2.0, 99.0], [3.0, 6.0, 99.0]])
    mask = jnp.asarray([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    std = np.sqrt(14 / 3 + 1e-8)
    np.testing.assert_allclose(whiten(x, mask), [[-2 / std, -1 / std, 0.0], [0.0, 3 / std, 0.0]], **close(atol=1e-6))
    assert not np.asarray(whiten(jnp.zeros((2, 3)), mask)).any()  # no 0/0: the estimator's zeros stay zeros
    assert not np.asarray(whiten(jnp.ones((1, 2)), jnp.asarray([[1.0, 0.0]]))).any()  # one real token


def test_the_gae_estimator_whitens_advantages_not_returns():
    rewards, values, mask, _ = random_batch(7)
    adv, returns = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.95)
    raw, raw_returns = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    np.testing.assert_allclose(adv, whiten(raw, mask), **close(atol=1e-6))
    np.testing.assert_array_equal(returns, raw_returns)
    real = np.asarray(adv)[mask > 0]
    assert abs(real.mean()) < 1e-5 and real.std(ddof=1) == approx(1.0, abs=1e-4)
    assert registry.get("token_advantage_estimator", "gae") is gae_advantages
    check_signature("token_advantage_estimator", "gae", gae_advantages)


def test_explained_variance_by_hand():
    mask = jnp.asarray([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    returns = jnp.asarray([[1.0, 1.0, 5.0], [0.0, 0.0, 5.0]])  # variance 0.25 over real tokens
    assert float(explained_variance(returns, returns, mask)) == approx(1.0)  # a perfect critic
    assert float(explained_variance(jnp.full((2, 3), 0.5), returns, mask)) == approx(0.0, abs=1e-6)  # the mean
    # values [0.75, 0.75, 0.25, 0.25]: residuals [0.25, 0.25, -0.25, -0.25], variance 0.0625: 1 - 0.0625 / 0.25
    values = jnp.asarray([[0.75, 0.75, 9.0], [0.25, 0.25, 9.0]])
    assert float(explained_variance(values, returns, mask)) == approx(0.75, abs=1e-5)
