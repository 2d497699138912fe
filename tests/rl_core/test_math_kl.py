"""rl_core.math.kl: k1, k2, k3 on hand-computed inputs, with and without jit, under vmap."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core import registry
from rl_core.math.kl import k1, k2, k3
from tolerances import close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])

# logp = log 0.5, ref_logp = log 0.25 -> d = ref_logp - logp = log 0.5 = -0.693147.
LOGP = jnp.full((1, 2), math.log(0.5))
REF = jnp.full((1, 2), math.log(0.25))


@VARIANTS
def test_known_values(variant):
    np.testing.assert_allclose(variant(k1)(LOGP, REF), [[0.693147] * 2], **close(atol=1e-5))  # -d
    np.testing.assert_allclose(variant(k2)(LOGP, REF), [[0.240227] * 2], **close(atol=1e-5))  # 0.693147^2 / 2
    np.testing.assert_allclose(variant(k3)(LOGP, REF), [[0.193147] * 2], **close(atol=1e-5))  # 0.5 + 0.693147 - 1


@VARIANTS
def test_positive_log_ratio(variant):
    # d = log 2 = 0.693147: k1 = -0.693147 (k1 can be negative); k2 = 0.240227;
    # k3 = 2 - 0.693147 - 1 = 0.306853.
    np.testing.assert_allclose(variant(k1)(REF, LOGP), [[-0.693147] * 2], **close(atol=1e-5))
    np.testing.assert_allclose(variant(k2)(REF, LOGP), [[0.240227] * 2], **close(atol=1e-5))
    np.testing.assert_allclose(variant(k3)(REF, LOGP), [[0.306853] * 2], **close(atol=1e-5))


@VARIANTS
@pytest.mark.parametrize("fn", [k1, k2, k3])
def test_equal_inputs_give_zero(variant, fn):
    logp = jnp.log(jnp.array([[0.1, 0.5, 0.9]]))
    assert (np.asarray(variant(fn)(logp, logp)) == 0.0).all()


def test_k3_nonnegative_and_accurate_for_small_d():
    d = jnp.array([[-20.0, -3.0, -1e-4, 0.0, 1e-4, 3.0, 10.0]])
    value = np.asarray(k3(jnp.zeros_like(d), d))
    assert (value >= 0).all()
    # Taylor: exp(d) - d - 1 = d^2/2 + d^3/6 + ...; at d = +-1e-4: 5e-9 +- 1.7e-13.
    # float32 expm1(1e-4) carries ~7e-12 of rounding, so 1e-2 relative is the honest
    # bound; a naive exp(d) - 1 - d is off by up to ~6e-8 here (ulp of 1.0001), >10x the value.
    np.testing.assert_allclose(value[0, [2, 4]], [5e-9, 5e-9], rtol=1e-2)


@VARIANTS
def test_k3_is_bounded_as_verl_bounds_it(variant):
    """d clamped to [-20, 20], k3 to at most 10. d = ref_logp - logp:
    d = 1: e - 1 - 1 = 0.718282 (inside both bounds);
    d = -2: e^-2 + 2 - 1 = 1.135335;
    d = 2.5: e^2.5 - 3.5 = 8.682494 (just under the cap);
    d = 3: e^3 - 4 = 16.0855 -> 10;  d = -12: e^-12 + 11 = 11.000006 -> 10;
    d = 25 (a token 25 nats below the reference): unbounded 7.2e10 -> 10."""
    d = jnp.array([[1.0, -2.0, 2.5, 3.0, -12.0, 25.0]])
    value = np.asarray(variant(k3)(jnp.zeros_like(d), d))
    np.testing.assert_allclose(value, [[0.718282, 1.135335, 8.682494, 10.0, 10.0, 10.0]], **close(rtol=1e-5))


@VARIANTS
def test_k3_gradient_is_finite_and_zero_at_a_masked_position(variant):
    """The loss sums mask * k3. A masked position holding logp = -inf (or 25 nats below the
    reference) gave 0 x inf = NaN in the backward pass and the whole update was skipped.
    Real token d = 1: dk3/dlogp = -(e^d - 1) = -1.718282; past the cap the gradient is 0."""
    ref = jnp.zeros((1, 3))
    mask = jnp.array([[1.0, 0.0, 0.0]])

    def loss(logp):
        return jnp.sum(mask * k3(logp, ref))

    grad = np.asarray(variant(jax.grad(loss))(jnp.array([[-1.0, -jnp.inf, -25.0]])))
    np.testing.assert_allclose(grad, [[-1.718282, 0.0, 0.0]], **close(rtol=1e-5))
    assert np.isfinite(grad).all()
    # and a real token past the cap pulls no harder than the cap: gradient 0, value 10
    value, grad = jax.value_and_grad(lambda x: jnp.sum(k3(x, ref[:, :1])))(jnp.array([[-25.0]]))
    assert float(value) == 10.0 and float(grad[0, 0]) == 0.0


def test_vmap():
    fn = jax.vmap(k3)
    out = fn(jnp.stack([LOGP, REF]), jnp.stack([REF, LOGP]))
    np.testing.assert_allclose(out, [[[0.193147] * 2], [[0.306853] * 2]], **close(atol=1e-5))


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="same shape"):
        k1(jnp.zeros((2, 3)), jnp.zeros((2, 4)))


def test_registry_finds_estimators():
    assert registry.get("kl_estimator", "k1") is k1
    assert registry.get("kl_estimator", "k2") is k2
    assert registry.get("kl_estimator", "k3") is k3
