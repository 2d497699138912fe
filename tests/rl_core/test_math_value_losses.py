"""rl_core.math.value_losses: the clipped value loss by hand, its gradient, jit and vmap."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core.math.value_losses import clipped_value_loss
from tolerances import close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])

# One token per case, c = 0.2, l = 1/2 max((V - G)^2, (V_old + clip(V - V_old, -c, c) - G)^2):
#   a: V 1.1, V_old 1.0, G 2.0: inside the band, both terms (1.1 - 2)^2 = 0.81         -> 0.405, not clipped
#   b: V 1.5, V_old 1.0, G 2.0: unclipped 0.25; clipped value 1.2, (1.2 - 2)^2 = 0.64   -> 0.32, clipped
#   c: V 0.5, V_old 1.0, G 0.0: unclipped 0.25; clipped value 0.8, 0.64                -> 0.32, clipped
#   d: V 1.5, V_old 1.0, G 1.0: unclipped 0.25; clipped value 1.2, 0.04: the max is the unclipped -> 0.125
#   e: a masked token with garbage                                                     -> 0
VALUES = [1.1, 1.5, 0.5, 1.5, 1e4]
OLD = [1.0, 1.0, 1.0, 1.0, -1e4]
RETURNS = [2.0, 2.0, 0.0, 1.0, 3e4]
MASK = [1.0, 1.0, 1.0, 1.0, 0.0]


def loss_of(values, clip=0.2):
    return clipped_value_loss(jnp.asarray([values]), jnp.asarray([OLD]), jnp.asarray([RETURNS]), jnp.asarray([MASK]),
                              clip=clip)


@VARIANTS
def test_hand_computed_cases(variant):
    loss, clipped = variant(lambda v: loss_of(v))(VALUES)
    np.testing.assert_allclose(loss, [[0.405, 0.32, 0.32, 0.125, 0.0]], **close(atol=1e-6))
    np.testing.assert_array_equal(clipped, [[0.0, 1.0, 1.0, 0.0, 0.0]])


@VARIANTS
def test_without_clip_it_is_half_the_squared_error(variant):
    # (V - G)^2 / 2: [0.405, 0.125, 0.125, 0.125, masked 0]
    loss, clipped = variant(lambda v: loss_of(v, clip=None))(VALUES)
    np.testing.assert_allclose(loss, [[0.405, 0.125, 0.125, 0.125, 0.0]], **close(atol=1e-6))
    assert not np.asarray(clipped).any()


def test_gradient_is_zero_where_the_bound_binds():
    # d/dV of 0.5 (V - G)^2 = V - G where the unclipped term is the max: a: -0.9, d: 0.5;
    # b and c take the clipped term, constant in V beyond the band: 0. The masked token: 0.
    grad = jax.grad(lambda v: jnp.sum(loss_of(v)[0]))(jnp.asarray(VALUES))
    np.testing.assert_allclose(grad, [-0.9, 0.0, 0.0, 0.5, 0.0], **close(atol=1e-6))


def test_under_vmap_rows_are_independent():
    values = jnp.asarray([VALUES, VALUES[::-1]])
    batched = jax.vmap(lambda v: loss_of(v)[0][0])(values)
    np.testing.assert_allclose(batched[0], loss_of(VALUES)[0][0], **close(rtol=1e-6, atol=1e-7))
    np.testing.assert_allclose(batched[1], loss_of(VALUES[::-1])[0][0], **close(rtol=1e-6, atol=1e-7))


@pytest.mark.parametrize("clip", [0.0, -0.1])
def test_a_clip_that_is_not_positive_is_an_error(clip):
    with pytest.raises(ValueError, match="must be > 0"):
        loss_of(VALUES, clip=clip)
