"""Inverse-CDF token sampling: exact probabilities on a grid of uniforms, never a token of probability 0."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core.sampler import SamplingParams, decode_uniforms, sample_token

# p = [0.2, 0.5, 0, 0.3]: token 2 has probability 0 (logit -inf, as top-k / top-p leave it)
PROBS = np.array([0.2, 0.5, 0.0, 0.3])
LOGITS = jnp.log(jnp.asarray(PROBS, jnp.float32))


@pytest.mark.parametrize("jit", [False, True])
def test_each_token_gets_its_share_of_the_uniforms(jit):
    n = 10_000
    u = jnp.arange(1, n + 1, dtype=jnp.float32) / n  # (0, 1], evenly spaced, 1.0 included
    fn = jax.jit(sample_token, static_argnums=2) if jit else sample_token
    tokens, logp = fn(u, jnp.broadcast_to(LOGITS, (n, 4)), SamplingParams(temperature=1.0))
    counts = np.bincount(np.asarray(tokens), minlength=4) / n
    # the CDF is [0.2, 0.7, 0.7, 1.0]: u in (0, 0.2] -> 0, (0.2, 0.7] -> 1, (0.7, 1] -> 3
    np.testing.assert_allclose(counts, PROBS, atol=2 / n)
    assert counts[2] == 0.0
    np.testing.assert_allclose(np.asarray(logp), np.log(PROBS[np.asarray(tokens)]), atol=1e-6)


def test_extreme_uniforms_never_pick_a_zero_probability_token():
    logits = jnp.asarray([[-jnp.inf, 1.0, -jnp.inf], [2.0, -jnp.inf, -jnp.inf]])
    for value in (2.0**-24, 0.5, 1.0):
        tokens, _ = sample_token(jnp.full((2,), value), logits, SamplingParams(temperature=0.7))
        assert np.asarray(tokens).tolist() == [1, 0]


def test_greedy_ignores_the_uniforms():
    tokens, logp = sample_token(jnp.asarray([1e-6]), LOGITS[None], SamplingParams(temperature=0.0))
    assert int(tokens[0]) == 1
    assert float(logp[0]) == pytest.approx(np.log(0.5), abs=1e-6)


def test_decode_uniforms_lie_in_the_half_open_unit_interval():
    u = np.asarray(decode_uniforms(jax.random.key(0), 64, 128))
    assert u.shape == (64, 128)
    assert (u > 0).all() and (u <= 1).all()
    assert 0.45 < u.mean() < 0.55
