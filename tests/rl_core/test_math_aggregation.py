"""rl_core.math.aggregation: (total, denominator) per mode, padding rows, micro-batch exactness."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core import registry
from rl_core.math.aggregation import (
    aggregate,
    seq_mean_token_mean,
    seq_mean_token_sum,
    seq_mean_token_sum_norm,
    token_mean,
)
from tolerances import close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

X = jnp.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
MASK = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
# Row sums of x*m: 1+2+3 = 6 and 5+6 = 11; token counts 3 and 2.
EXPECTED = {
    "token-mean": (17.0, 5.0),  # 17 / 5 = 3.4
    "seq-mean-token-mean": (7.5, 2.0),  # (6/3 + 11/2) / 2 = (2 + 5.5) / 2 = 3.75
    "seq-mean-token-sum": (17.0, 2.0),  # (6 + 11) / 2 = 8.5
    "seq-mean-token-sum-norm": (4.25, 2.0),  # (6/4 + 11/4) / 2 = 2.125
}
MEANS = {"token-mean": 3.4, "seq-mean-token-mean": 3.75, "seq-mean-token-sum": 8.5, "seq-mean-token-sum-norm": 2.125}


@VARIANTS
@pytest.mark.parametrize("mode", MODES)
def test_each_mode_by_hand(variant, mode):
    fn = variant(functools.partial(aggregate, mode, max_len=4))
    total, denom = fn(X, MASK)
    assert total.dtype == denom.dtype == jnp.float32
    assert total.shape == denom.shape == ()
    np.testing.assert_allclose([total, denom], EXPECTED[mode], **close(atol=1e-5))
    np.testing.assert_allclose(total / denom, MEANS[mode], **close(atol=1e-5))


@pytest.mark.parametrize("mode", MODES)
def test_padding_row_changes_no_mean(mode):
    # A third row with no real tokens, and garbage (even inf/NaN) where masked.
    x = jnp.concatenate([X, jnp.array([[jnp.inf, jnp.nan, 9.0, -9.0]])])
    mask = jnp.concatenate([MASK, jnp.zeros((1, 4))])
    total, denom = aggregate(mode, x, mask, max_len=4)
    np.testing.assert_allclose([total, denom], EXPECTED[mode], **close(atol=1e-5))


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_are_exact(mode):
    # Split the 2 rows into two 1-row micro-batches; summing (total, denom) pairs
    # and dividing once gives the full-batch mean.
    parts = [aggregate(mode, X[i : i + 1], MASK[i : i + 1], max_len=4) for i in range(2)]
    total = sum(p[0] for p in parts)
    denom = sum(p[1] for p in parts)
    np.testing.assert_allclose(total / denom, MEANS[mode], **close(atol=1e-5))


@pytest.mark.parametrize("mode", MODES)
def test_all_padding_gives_zero_not_nan(mode):
    total, denom = aggregate(mode, X, jnp.zeros_like(MASK), max_len=4)
    assert (float(total), float(denom)) == (0.0, 0.0)
    grad = jax.grad(lambda x: aggregate(mode, x, jnp.zeros_like(MASK), max_len=4)[0])(X)
    assert np.isfinite(np.asarray(grad)).all()


def test_gradient_weights_by_mode():
    # d total / d x_bt: token-mean m; seq-mean-token-mean m / n_b (1/3, 1/2);
    # seq-mean-token-sum m; -norm m / L_max (1/4).
    grads = {mode: jax.grad(lambda x, mode=mode: aggregate(mode, x, MASK, max_len=4)[0])(X) for mode in MODES}
    np.testing.assert_allclose(grads["token-mean"], MASK, **close(atol=1e-6))
    np.testing.assert_allclose(grads["seq-mean-token-mean"], [[1 / 3] * 3 + [0], [0.5] * 2 + [0, 0]],
        **close(atol=1e-6))
    np.testing.assert_allclose(grads["seq-mean-token-sum"], MASK, **close(atol=1e-6))
    np.testing.assert_allclose(grads["seq-mean-token-sum-norm"], MASK / 4, **close(atol=1e-6))


@pytest.mark.parametrize("mode", MODES)
def test_vmap(mode):
    # Two copies of the batch, the second scaled by 2: totals double, denominators stay.
    fn = jax.vmap(functools.partial(aggregate, mode, max_len=4))
    total, denom = fn(jnp.stack([X, 2 * X]), jnp.stack([MASK, MASK]))
    t, d = EXPECTED[mode]
    np.testing.assert_allclose(total, [t, 2 * t], **close(atol=1e-5))
    np.testing.assert_allclose(denom, [d, d], **close(atol=1e-5))


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match=r"\[B, T\] like the mask or \[B\]"):
        token_mean(X, MASK[:, :3], max_len=4)
    with pytest.raises(ValueError, match=r"\[B, T\] like the mask or \[B\]"):
        token_mean(jnp.ones(3), MASK, max_len=4)  # a per-sequence term needs one value per row
    with pytest.raises(ValueError, match="max_len.*got 0"):
        seq_mean_token_sum_norm(X, MASK, max_len=0)
    with pytest.raises(registry.RegistryError, match="token-mean"):
        aggregate("token_mean", X, MASK, max_len=4)


def test_registry_finds_modes():
    assert registry.get("loss_aggregation", "token-mean") is token_mean
    assert registry.get("loss_aggregation", "seq-mean-token-mean") is seq_mean_token_mean
    assert registry.get("loss_aggregation", "seq-mean-token-sum") is seq_mean_token_sum
    assert registry.get("loss_aggregation", "seq-mean-token-sum-norm") is seq_mean_token_sum_norm


@pytest.mark.parametrize(
    ("foreign", "ours"),
    [
        ("sequence-mean-token-mean", "seq-mean-token-mean"),  # Tunix
        ("sequence-mean-token-scale", "seq-mean-token-sum-norm"),  # Tunix: sums / L_max, mean over rows
        ("sequence-mean-token-sum-norm", "seq-mean-token-sum"),  # Tunix: sums / #rows by default
        ("grpo", "seq-mean-token-mean"),  # TRL loss_type
        ("bnpo", "token-mean"),
        ("dr_grpo", "seq-mean-token-sum-norm"),
        ("dapo", "token-mean"),
    ],
)
def test_other_libraries_names_state_the_equivalent_mode_never_a_near_miss(foreign, ours):
    from rl_core import registry
    from rl_core.config import AlgorithmConfig, ConfigError

    with pytest.raises(ConfigError) as info:
        AlgorithmConfig(loss_agg_mode=foreign)
    message = str(info.value)
    assert f"use '{ours}'" in message or f"is '{ours}' here" in message
    assert "Did you mean" not in message  # difflib would map Tunix's -sum-norm to our -sum-norm
    registry.get("loss_aggregation", ours)  # the named equivalent exists


# -- per-sequence terms: x_i stands for the same value on each of its real tokens ----------

SEQ = jnp.array([2.0, 3.0, 100.0])  # one value per sequence; the third row has no real token
SEQ_MASK = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
# lengths 3 and 2 (and 0):
SEQ_MEANS = {
    "token-mean": 2.4,  # (2*3 + 3*2) / 5 = 12 / 5: each sequence weighs by its length
    "seq-mean-token-mean": 2.5,  # (2 + 3) / 2: the plain mean over non-empty sequences (GSPO)
    "seq-mean-token-sum": 6.0,  # (2*3 + 3*2) / 2
    "seq-mean-token-sum-norm": 1.5,  # (6/4 + 6/4) / 2 with L_max = 4
}


@VARIANTS
@pytest.mark.parametrize("mode", MODES)
def test_per_sequence_terms_by_hand(variant, mode):
    total, denom = variant(functools.partial(aggregate, mode, max_len=4))(SEQ, SEQ_MASK)
    np.testing.assert_allclose(total / denom, SEQ_MEANS[mode], **close(atol=1e-6))
    # ... exactly what the same value written on every token of its row gives
    spread = jnp.broadcast_to(SEQ[:, None], SEQ_MASK.shape)
    np.testing.assert_allclose([total, denom], aggregate(mode, spread, SEQ_MASK, max_len=4), **close(atol=1e-6))


@pytest.mark.parametrize(
    ("mode", "weights"),
    [
        ("token-mean", [3 / 5, 2 / 5, 0.0]),  # d(mean)/dx_i = |y_i| / sum |y|
        ("seq-mean-token-mean", [0.5, 0.5, 0.0]),  # 1 / #non-empty sequences
        ("seq-mean-token-sum", [1.5, 1.0, 0.0]),  # |y_i| / 2
        ("seq-mean-token-sum-norm", [3 / 8, 2 / 8, 0.0]),  # |y_i| / (L_max * 2)
    ],
)
def test_per_sequence_gradient_weights_by_hand(mode, weights):
    grad = jax.grad(lambda x: jnp.divide(*aggregate(mode, x, SEQ_MASK, max_len=4)))(SEQ)
    np.testing.assert_allclose(grad, weights, **close(atol=1e-6))


def test_per_token_spreads_only_one_value_per_row():
    from rl_core.math.aggregation import per_token

    np.testing.assert_array_equal(per_token(SEQ, SEQ_MASK)[:, 3], SEQ)
    assert per_token(X, MASK) is X  # a [B, T] array is left as it is
