"""rl_core.math.policy_losses: clipped surrogate values, clip indicators and gradients by hand."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core import registry
from rl_core.math.policy_losses import PolicyLossAux, clipped_surrogate
from tolerances import close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])
SYM = dict(eps_low=0.2, eps_high=0.2)
ASYM = dict(eps_low=0.2, eps_high=0.28)


def _run(variant, ratios, adv, **kw):
    """One token per completion: logp = log(rho), old_logp = 0, so exp(logp - old_logp) = rho."""
    logp = jnp.log(jnp.asarray(ratios, jnp.float32))[:, None]
    fn = variant(functools.partial(clipped_surrogate, **kw))
    loss, aux = fn(logp, jnp.zeros_like(logp), jnp.asarray(adv, jnp.float32), jnp.ones_like(logp))
    return np.asarray(loss[:, 0]), jax.tree.map(lambda a: np.asarray(a[:, 0]), aux)


# Rows: (A, rho). Window sym [0.8, 1.2], asym [0.8, 1.28].
CASES_A = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 2.0]
CASES_RHO = [1.5, 0.5, 1.0, 0.5, 1.5, 1.0, 1.1]


@VARIANTS
def test_symmetric_clipping(variant):
    loss, aux = _run(variant, CASES_RHO, CASES_A, **SYM)
    expected = [
        -1.2,  # A=+1, rho=1.5 above: min(1.5, 1.2) = 1.2 -> -1.2, clipped high
        -0.5,  # A=+1, rho=0.5 below: min(0.5, 0.8) = 0.5 -> -0.5, unclipped (pessimistic)
        -1.0,  # rho=1 inside: -A
        0.8,  # A=-1, rho=0.5 below: min(-0.5, -0.8) = -0.8 -> 0.8, clipped low
        1.5,  # A=-1, rho=1.5 above: min(-1.5, -1.2) = -1.5 -> 1.5, unclipped
        1.0,  # rho=1 inside: -A
        -2.2,  # A=2, rho=1.1 inside: -(1.1 * 2)
    ]
    np.testing.assert_allclose(loss, expected, **close(atol=1e-5))
    np.testing.assert_allclose(aux.ratio, CASES_RHO, **close(atol=1e-6))
    np.testing.assert_array_equal(aux.clipped_high, [1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(aux.clipped_low, [0, 0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(aux.dual_clipped, [0] * 7)


@VARIANTS
def test_asymmetric_clipping(variant):
    loss, aux = _run(variant, CASES_RHO, CASES_A, **ASYM)
    # Only the upper bound moved (1.2 -> 1.28): row 0 is now min(1.5, 1.28) = 1.28.
    np.testing.assert_allclose(loss, [-1.28, -0.5, -1.0, 0.8, 1.5, 1.0, -2.2], **close(atol=1e-5))
    np.testing.assert_array_equal(aux.clipped_high, [1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(aux.clipped_low, [0, 0, 0, 1, 0, 0, 0])
    # rho = 1.25 is clipped by 0.2/0.2 (-1.2) but inside 0.2/0.28 (-1.25).
    loss_sym, aux_sym = _run(variant, [1.25], [1.0], **SYM)
    loss_asym, aux_asym = _run(variant, [1.25], [1.0], **ASYM)
    np.testing.assert_allclose([loss_sym[0], loss_asym[0]], [-1.2, -1.25], **close(atol=1e-5))
    assert (aux_sym.clipped_high[0], aux_asym.clipped_high[0]) == (1.0, 0.0)


@VARIANTS
def test_dual_clip(variant):
    # c = 3. A=-1, rho=5: min(-5, -1.2) = -5; max(-5, 3 * -1) = -3 -> loss 3 (not 5).
    # A=-1, rho=2: min(-2, -1.2) = -2 > -3, so the dual bound is inactive -> 2.
    # A=+1, rho=5: dual clip applies only to A < 0 -> -1.2, clipped high.
    # A=-1, rho=0.5: clipped low as without dual clip -> 0.8.
    loss, aux = _run(variant, [5.0, 2.0, 5.0, 0.5], [-1.0, -1.0, 1.0, -1.0], dual_clip=3.0, **SYM)
    np.testing.assert_allclose(loss, [3.0, 2.0, -1.2, 0.8], **close(atol=1e-5))
    np.testing.assert_array_equal(aux.dual_clipped, [1, 0, 0, 0])
    np.testing.assert_array_equal(aux.clipped_high, [0, 0, 1, 0])
    np.testing.assert_array_equal(aux.clipped_low, [0, 0, 0, 1])


@pytest.mark.parametrize("kw", [dict(ASYM, dual_clip=3.0), SYM])
def test_gradient_zero_where_clipped(kw):
    # d/dlogp of -rho*A is -A*rho where the unclipped term is active, 0 where clipped.
    a = jnp.array([1.0, 1.0, -1.0, -1.0, 2.0, -1.0])
    rho = jnp.array([1.5, 0.5, 0.5, 1.5, 1.1, 5.0])
    # clipped-high, -1*0.5, clipped-low, +1*1.5, -2*1.1, (dual clip: 0 | no dual clip: 5).
    dual = kw.get("dual_clip") is not None
    expected = [0.0, -0.5, 0.0, 1.5, -2.2, 0.0 if dual else 5.0]
    old = jnp.zeros((6, 1))

    def total(logp):
        return clipped_surrogate(logp, old, a, jnp.ones_like(old), **kw)[0].sum()

    for variant in (lambda f: f, jax.jit):
        grad = variant(jax.grad(total))(jnp.log(rho)[:, None])
        np.testing.assert_allclose(grad[:, 0], expected, **close(atol=1e-5))


def test_ratio_from_stop_gradient_old_logp():
    # num_iterations == 1: old_logp = stop_gradient(logp) -> rho = 1, loss = -A, grad = -A.
    logp = jnp.log(jnp.array([[0.3, 0.6], [0.2, 0.9]]))
    adv = jnp.array([0.5, -2.0])

    def total(lp):
        return clipped_surrogate(lp, jax.lax.stop_gradient(lp), adv, jnp.ones_like(lp), **SYM)[0].sum()

    loss, _ = clipped_surrogate(logp, logp, adv, jnp.ones_like(logp), **SYM)
    np.testing.assert_allclose(loss, [[-0.5, -0.5], [2.0, 2.0]], **close(atol=1e-6))
    np.testing.assert_allclose(jax.grad(total)(logp), [[-0.5, -0.5], [2.0, 2.0]], **close(atol=1e-6))


def test_vmap_and_shapes():
    # [2 batches, B=2, T=3]; each token ratio e^{log 1.5} = 1.5 with A = +1 / -1.
    logp = jnp.full((2, 2, 3), math.log(1.5))
    adv = jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    fn = jax.vmap(functools.partial(clipped_surrogate, **SYM))
    loss, aux = fn(logp, jnp.zeros_like(logp), adv, jnp.ones_like(logp))
    assert isinstance(aux, PolicyLossAux)
    assert loss.shape == aux.clipped_high.shape == (2, 2, 3)
    np.testing.assert_allclose(loss[0, 0], [-1.2] * 3, **close(atol=1e-5))
    np.testing.assert_allclose(loss[0, 1], [1.5] * 3, **close(atol=1e-5))
    np.testing.assert_allclose(loss[1, 0], [1.5] * 3, **close(atol=1e-5))
    np.testing.assert_array_equal(aux.clipped_high[1], [[0] * 3, [1] * 3])


def test_bad_arguments_raise():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="dual_clip must be > 1.*0.5"):
        clipped_surrogate(x, x, jnp.zeros(2), x, dual_clip=0.5, **SYM)
    with pytest.raises(ValueError, match="eps_low"):
        clipped_surrogate(x, x, jnp.zeros(2), x, eps_low=1.5, eps_high=0.2)
    with pytest.raises(ValueError, match="adv must be"):
        clipped_surrogate(x, x, jnp.zeros(3), x, **SYM)
    with pytest.raises(ValueError, match="same shape"):
        clipped_surrogate(x, jnp.zeros((2, 4)), jnp.zeros(2), x, **SYM)
    with pytest.raises(ValueError, match="mask"):
        clipped_surrogate(x, x, jnp.zeros(2), jnp.zeros((2, 4)), **SYM)


@pytest.mark.parametrize("garbage", [1e30, -1e30, jnp.inf, -jnp.inf, jnp.nan])
def test_garbage_at_padded_positions_leaves_loss_and_gradient_as_in_the_clean_case(garbage):
    # Row 0 has 2 real tokens, row 1 has 1; the padded positions of old_logp (and of logp,
    # through the forward pass) hold garbage. exp(logp - old) there would be inf or NaN,
    # and 0 * inf in the backward pass NaN: the log-ratio is zeroed before the exponent.
    from rl_core.math.aggregation import token_mean

    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    logp = jnp.log(jnp.array([[0.5, 0.25, 0.5], [0.225, 0.5, 0.5]]))
    old_clean = jnp.log(jnp.array([[0.4, 0.25, 0.5], [0.25, 0.5, 0.5]]))
    old_dirty = jnp.where(mask > 0, old_clean, garbage)
    adv = jnp.array([1.0, -1.0])

    def total(lp, old):
        lp = jnp.where(mask > 0, lp, lp + garbage)  # garbage in the current log-probs too
        loss, _ = clipped_surrogate(lp, old, adv, mask, **SYM)
        t, d = token_mean(loss, mask, max_len=3)
        return t / d

    clean_value, clean_grad = jax.value_and_grad(total)(logp, old_clean)
    value, grad = jax.value_and_grad(total)(logp, old_dirty)
    # ratios 1.25 (A=+1, clipped at 1.2), 1.0 and 0.9 (A=-1, inside): -(1.2 + 1.0 - 0.9) / 3
    np.testing.assert_allclose(clean_value, -(1.2 + 1.0 - 0.9) / 3, **close(atol=1e-6))
    assert np.isfinite(np.asarray(grad)).all()
    np.testing.assert_array_equal(np.asarray(value), np.asarray(clean_value))
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(clean_grad))
    # d/dlogp: 0 (clipped), -1 * 1.0 / 3, +1 * 0.9 / 3; padded positions exactly 0
    np.testing.assert_allclose(grad, [[0.0, -1 / 3, 0.0], [0.9 / 3, 0.0, 0.0]], **close(atol=1e-6))


def test_log_ratio_is_bounded():
    from rl_core.math.policy_losses import LOG_RATIO_BOUND, log_ratio

    mask = jnp.ones((1, 3))
    d = log_ratio(jnp.array([[0.0, -100.0, 3.0]]), jnp.array([[-100.0, 0.0, 1.0]]), mask)
    np.testing.assert_allclose(d, [[LOG_RATIO_BOUND, -LOG_RATIO_BOUND, 2.0]], **close())


def test_registry_finds_both_names():
    assert registry.get("policy_loss", "clipped_surrogate") is clipped_surrogate
    assert registry.get("policy_loss", "grpo") is clipped_surrogate


# -- per-token advantages and truncated importance sampling ----------------------------------


@VARIANTS
def test_per_token_advantages_by_hand(variant):
    # rho = [1.5, 0.9] on one row, A per token [1, -1] (eps 0.2):
    #   token 0: min(1.5 * 1, 1.2 * 1) = 1.2 -> loss -1.2 (clipped high)
    #   token 1: min(0.9 * -1, 0.9 * -1) = -0.9 -> loss 0.9 (inside the range)
    logp = jnp.log(jnp.asarray([[1.5, 0.9]]))
    loss, aux = variant(functools.partial(clipped_surrogate, **SYM))(logp, jnp.zeros((1, 2)), jnp.asarray([[1.0, -1.0]]), jnp.ones((1, 2)))
    np.testing.assert_allclose(loss, [[-1.2, 0.9]], **close(atol=1e-6))
    np.testing.assert_array_equal(aux.clipped_high, [[1, 0]])


@VARIANTS
def test_truncated_is_weights_by_hand(variant):
    from rl_core.math.policy_losses import truncated_is_weights

    # old - sampler = [log 1.5, log 3, -log 2, garbage at a masked position]; C = 2:
    # weights min([1.5, 3, 0.5], 2) = [1.5, 2, 0.5], and 1 where masked.
    sampler = jnp.asarray([[-1.0, -2.0, -3.0, jnp.nan]])
    old = sampler + jnp.log(jnp.asarray([[1.5, 3.0, 0.5, 1.0]]))
    mask = jnp.asarray([[1.0, 1.0, 1.0, 0.0]])
    w = variant(functools.partial(truncated_is_weights, cap=2.0))(old, sampler, mask)
    np.testing.assert_allclose(w, [[1.5, 2.0, 0.5, 1.0]], **close(atol=1e-6))
    # constants for the loss: no gradient flows to either log-prob
    grad = jax.grad(lambda o: jnp.sum(truncated_is_weights(o, sampler, mask, cap=2.0)))(old)
    assert np.array_equal(np.asarray(grad), np.zeros((1, 4)))
    with pytest.raises(ValueError, match="cap C must be >= 1"):
        truncated_is_weights(old, sampler, mask, cap=0.5)
