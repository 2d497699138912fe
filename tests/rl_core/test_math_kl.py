"""rl_core.kl: k1, k2, k3 on hand-computed inputs, with and without jit, under vmap."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core import registry
from rl_core.kl import k1, k2, k3

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])

# logp = log 0.5, ref_logp = log 0.25 -> d = ref_logp - logp = log 0.5 = -0.693147.
LOGP = jnp.full((1, 2), math.log(0.5))
REF = jnp.full((1, 2), math.log(0.25))


@VARIANTS
def test_known_values(variant):
    np.testing.assert_allclose(variant(k1)(LOGP, REF), [[0.693147] * 2], atol=1e-5)  # -d
    np.testing.assert_allclose(variant(k2)(LOGP, REF), [[0.240227] * 2], atol=1e-5)  # 0.693147^2 / 2
    np.testing.assert_allclose(variant(k3)(LOGP, REF), [[0.193147] * 2], atol=1e-5)  # 0.5 + 0.693147 - 1


@VARIANTS
def test_positive_log_ratio(variant):
    # d = log 2 = 0.693147: k1 = -0.693147 (k1 can be negative); k2 = 0.240227;
    # k3 = 2 - 0.693147 - 1 = 0.306853.
    np.testing.assert_allclose(variant(k1)(REF, LOGP), [[-0.693147] * 2], atol=1e-5)
    np.testing.assert_allclose(variant(k2)(REF, LOGP), [[0.240227] * 2], atol=1e-5)
    np.testing.assert_allclose(variant(k3)(REF, LOGP), [[0.306853] * 2], atol=1e-5)


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


def test_vmap():
    fn = jax.vmap(k3)
    out = fn(jnp.stack([LOGP, REF]), jnp.stack([REF, LOGP]))
    np.testing.assert_allclose(out, [[[0.193147] * 2], [[0.306853] * 2]], atol=1e-5)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="same shape"):
        k1(jnp.zeros((2, 3)), jnp.zeros((2, 4)))


def test_registry_finds_estimators():
    assert registry.get("kl_estimator", "k1") is k1
    assert registry.get("kl_estimator", "k2") is k2
    assert registry.get("kl_estimator", "k3") is k3
