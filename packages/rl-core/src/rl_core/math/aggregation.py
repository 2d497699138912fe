"""Loss aggregation modes: per-token x [B, T] (or per-sequence [B]) with mask [B, T] -> (total, denominator).

Each mode returns a pair of float32 scalars, not a mean. The
learner sums totals and denominators over micro-batches and divides once, so
gradient accumulation is exact: the denominator never depends on parameters,
and for the "mean over sequences" modes each sequence's term depends only on
its own row, so splitting rows across micro-batches changes nothing.

- "token-mean":              (sum(x*m), sum(m))                                   DAPO
- "seq-mean-token-mean":     (sum_b sum_t(x*m)/sum_t(m), #non-empty sequences)    GRPO
- "seq-mean-token-sum":      (sum_b sum_t(x*m), #non-empty sequences)
- "seq-mean-token-sum-norm": (sum_b sum_t(x*m) / L_max, #non-empty sequences)     Dr.GRPO

Rows with no real token (padding rows, filtered completions) contribute 0 to
both total and denominator. Every mode accepts `max_len` (L_max, in tokens)
for a uniform call; only the -norm mode uses it.

Per-sequence terms. `x` may also be [B], one value per sequence (a
sequence-level loss such as GSPO's). The rule: a per-sequence value x_i stands
for the same value on every real token of sequence i, x[i, t] = x_i * m[i, t]
(`per_token`), and then every mode applies unchanged. So seq-mean-token-mean
gives the plain mean over non-empty sequences, mean_i x_i; token-mean weighs
each sequence by its length, sum_i |y_i| x_i / sum_i |y_i|; seq-mean-token-sum
gives mean_i |y_i| x_i (and /L_max for -norm). A token-level form whose
value equals x_i on every token (GSPO-token) aggregates to the same number in
every mode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl_core import registry
from rl_core.registry import register


def per_token(x: jax.Array, mask: jax.Array) -> jax.Array:
    """`x` as [B, T]: a per-sequence [B] value repeated on every position of its row
    (the mask then keeps the real tokens); a [B, T] array as it is."""
    if jnp.ndim(x) == 1 and jnp.ndim(mask) == 2 and jnp.shape(x)[0] == jnp.shape(mask)[0]:
        return jnp.broadcast_to(jnp.asarray(x)[:, None], jnp.shape(mask))
    return x


def _masked(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """float32 (x*m, m); padded positions are exactly 0 even if x is inf/NaN there."""
    x = per_token(x, mask)
    if jnp.shape(x) != jnp.shape(mask) or jnp.ndim(x) != 2:
        raise ValueError(
            f"x must be [B, T] like the mask or [B] (one value per sequence); got {jnp.shape(x)} and mask {jnp.shape(mask)}"
        )
    m = jnp.asarray(mask, jnp.float32)
    xm = jnp.where(m != 0, jnp.asarray(x, jnp.float32) * m, 0.0)
    return xm, m


def _rows(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-row (sum_t x*m [B], sum_t m [B], non-empty [B] as float32)."""
    xm, m = _masked(x, mask)
    row_total = jnp.sum(xm, axis=1)
    row_count = jnp.sum(m, axis=1)
    return row_total, row_count, (row_count > 0).astype(jnp.float32)


def _check_max_len(max_len: int) -> None:
    if isinstance(max_len, (int, float)) and max_len <= 0:
        raise ValueError(f"max_len (L_max, the maximum completion length in tokens) must be > 0, got {max_len}")


@register("loss_aggregation", "token-mean")
def token_mean(x: jax.Array, mask: jax.Array, *, max_len: int) -> tuple[jax.Array, jax.Array]:
    """Every real token in the batch weighs the same: (sum(x*m), sum(m))."""
    del max_len  # accepted for a uniform call
    xm, m = _masked(x, mask)
    return jnp.sum(xm), jnp.sum(m)


@register("loss_aggregation", "seq-mean-token-mean")
def seq_mean_token_mean(x: jax.Array, mask: jax.Array, *, max_len: int) -> tuple[jax.Array, jax.Array]:
    """Every sequence weighs the same; tokens average within their sequence."""
    del max_len
    row_total, row_count, nonempty = _rows(x, mask)
    # Guard the division: an empty row would be 0/0 = NaN (also in the gradient).
    per_row = jnp.where(nonempty > 0, row_total / jnp.where(nonempty > 0, row_count, 1.0), 0.0)
    return jnp.sum(per_row), jnp.sum(nonempty)


@register("loss_aggregation", "seq-mean-token-sum")
def seq_mean_token_sum(x: jax.Array, mask: jax.Array, *, max_len: int) -> tuple[jax.Array, jax.Array]:
    """Every sequence weighs the same; tokens sum within their sequence."""
    del max_len
    row_total, _, nonempty = _rows(x, mask)
    return jnp.sum(row_total), jnp.sum(nonempty)


@register("loss_aggregation", "seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(x: jax.Array, mask: jax.Array, *, max_len: int) -> tuple[jax.Array, jax.Array]:
    """Token sums divided by the constant L_max (Dr.GRPO): no length bias from 1/|y|."""
    _check_max_len(max_len)
    row_total, _, nonempty = _rows(x, mask)
    return jnp.sum(row_total) / max_len, jnp.sum(nonempty)


# Other libraries' names for these modes. A spelling suggestion would swap meanings here
# (Tunix's "sequence-mean-token-sum-norm" is "seq-mean-token-sum", not our "-norm" mode),
# so each gets its exact equivalent instead.
FOREIGN_NAMES = {
    "sequence-mean-token-mean": "That is Tunix's name for 'seq-mean-token-mean': use 'seq-mean-token-mean'.",
    "sequence-mean-token-scale": (
        "That is Tunix's name for token sums divided by the response length L_max, averaged over sequences "
        "(Dr. GRPO): use 'seq-mean-token-sum-norm'."
    ),
    "sequence-mean-token-sum-norm": (
        "That is Tunix's name for token sums averaged over sequences (its default norm is the number of "
        "sequences): use 'seq-mean-token-sum'."
    ),
    "grpo": "TRL's loss_type 'grpo' is 'seq-mean-token-mean' here.",
    "bnpo": "TRL's loss_type 'bnpo' (a token mean per local batch) is 'token-mean' here.",
    "dr_grpo": "TRL's loss_type 'dr_grpo' is 'seq-mean-token-sum-norm' here.",
    "dapo": "TRL's loss_type 'dapo' is 'token-mean' here.",
}
for _name, _meaning in FOREIGN_NAMES.items():
    registry.registry.note_foreign_name("loss_aggregation", _name, _meaning)


def aggregate(mode: str, x: jax.Array, mask: jax.Array, *, max_len: int) -> tuple[jax.Array, jax.Array]:
    """(total, denominator) of `x` under the aggregation `mode`, looked up by name."""
    return registry.get("loss_aggregation", mode)(x, mask, max_len=max_len)
