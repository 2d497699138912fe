"""CISPO: the clipped, detached IS weight times A log pi, by hand; every token keeps its gradient."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algo_cispo import CISPOConfig, cispo_loss
from rl_core import registry
from rl_core.math.aggregation import aggregate
from rl_core.config import ConfigError
from rl_core.math.policy_losses import clipped_surrogate
from tolerances import approx, close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])
PAPER = dict(eps_low=1.0, eps_high=0.28)  # no lower bound; eps_high as in CISPOConfig

# Three completions, T = 3:
#   row 0: ratios [1.5, 0.5, 1.0], logp [-1, -2, -0.5], A = 2: weights clip(r, 0, 1.28) = [1.28, 0.5, 1.0]
#          loss -w A logp = [2.56, 2.0, 1.0]; gradient d/dlogp = -w A = [-2.56, -1.0, -2.0]
#   row 1: one token, ratio 1, logp -3, A = -1: loss -(1)(-1)(-3) = -3; gradient +1
#   row 2: fully masked (garbage logp): loss 0 and no gradient
LOGP = jnp.asarray([[-1.0, -2.0, -0.5], [-3.0, jnp.inf, 0.0], [jnp.nan, -jnp.inf, 4.0]])
OLD = jnp.asarray([[-1.0 - np.log(1.5), -2.0 - np.log(0.5), -0.5], [-3.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
MASK = jnp.asarray([[1.0, 1, 1], [1, 0, 0], [0, 0, 0]])
ADV = jnp.asarray([2.0, -1.0, 7.0])


@VARIANTS
def test_loss_weights_and_clip_flags_by_hand(variant):
    loss, aux = variant(functools.partial(cispo_loss, **PAPER, dual_clip=None))(LOGP, OLD, ADV, MASK)
    np.testing.assert_allclose(loss, [[2.56, 2.0, 1.0], [-3.0, 0.0, 0.0], [0.0, 0.0, 0.0]], **close(atol=1e-5))
    np.testing.assert_allclose(aux.ratio[0], [1.5, 0.5, 1.0], **close(atol=1e-5))
    np.testing.assert_array_equal(aux.clipped_high, [[1, 0, 0], [0, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(aux.clipped_low, np.zeros((3, 3)))  # 1 - eps_low = 0: never


@VARIANTS
def test_token_mean_and_gradients_through_every_token(variant):
    def mean_loss(logp):
        total, denom = aggregate("token-mean", cispo_loss(logp, OLD, ADV, MASK, **PAPER)[0], MASK, max_len=3)
        return total / denom

    value, grad = variant(jax.value_and_grad(mean_loss))(LOGP)
    # (2.56 + 2.0 + 1.0 - 3.0) / 4 real tokens = 0.64
    np.testing.assert_allclose(value, 0.64, **close(atol=1e-5))
    # -w A / 4 per real token; the clipped token (ratio 1.5 > 1.28) still has gradient -2.56 / 4.
    np.testing.assert_allclose(grad, [[-0.64, -0.25, -0.5], [0.25, 0.0, 0.0], [0.0, 0.0, 0.0]], **close(atol=1e-6))
    assert np.all(np.isfinite(grad))


def test_unlike_the_clipped_surrogate_a_clipped_token_keeps_its_gradient():
    # The same token 0 of row 0 (ratio 1.5, A = 2): GRPO's clip at 1.2 makes its gradient exactly 0.
    def token0(fn, **eps):
        return jax.grad(lambda lp: fn(lp, OLD, ADV, MASK, dual_clip=None, **eps)[0][0, 0])(LOGP)[0, 0]

    assert float(token0(clipped_surrogate, eps_low=0.2, eps_high=0.2)) == 0.0
    assert float(token0(cispo_loss, **PAPER)) == approx(-2.56, abs=1e-5)


def test_the_weight_carries_no_gradient():
    # d/dlogp of -sg(w) A logp is -w A: the ratio inside w is not differentiated
    # (else row 1, ratio 1, would get -(1 + logp) A = -(1 - 3)(-1) = -2 instead of +1).
    grad = jax.grad(lambda lp: jnp.sum(cispo_loss(lp, OLD, ADV, MASK, **PAPER)[0]))(LOGP)
    assert float(grad[1, 0]) == approx(1.0, abs=1e-6)


def test_a_tied_group_contributes_nothing():
    zero = jnp.zeros(3)
    loss, _ = cispo_loss(LOGP, OLD, zero, MASK, **PAPER)
    assert np.array_equal(np.asarray(loss), np.zeros((3, 3)))


def test_dual_clip_is_rejected():
    with pytest.raises(ValueError, match="no dual clip"):
        cispo_loss(LOGP, OLD, ADV, MASK, **PAPER, dual_clip=3.0)
    with pytest.raises(ConfigError, match="CISPOConfig.dual_clip = 3.0: CISPO has no dual clip"):
        CISPOConfig(dual_clip=3.0)


def test_config_defaults_and_registration():
    cfg = CISPOConfig()
    assert (cfg.policy_loss, cfg.epsilon_low, cfg.epsilon_high) == ("cispo", 1.0, 0.28)
    assert (cfg.loss_agg_mode, cfg.beta, cfg.advantage_estimator) == ("token-mean", 0.0, "grpo")
    assert registry.get("policy_loss", "cispo") is cispo_loss
    assert registry.registry.provider("policy_loss", "cispo") == "algo-cispo"
