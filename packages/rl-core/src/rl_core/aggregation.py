"""Loss aggregation modes: per-token x [B, T] with mask [B, T] -> (total, denominator).

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
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl_core import registry
from rl_core.registry import register


def _masked(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """float32 (x*m, m); padded positions are exactly 0 even if x is inf/NaN there."""
    if jnp.shape(x) != jnp.shape(mask) or jnp.ndim(x) != 2:
        raise ValueError(f"x and mask must both be [B, T] with the same shape, got {jnp.shape(x)} and {jnp.shape(mask)}")
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
