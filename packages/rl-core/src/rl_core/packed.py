"""Sequences packed into rows, as the passes read them: `Packed` (what rl_core.train.packing
builds on the host and a TrainExample carries into the update) and `unpack` (the policy's
log-prob pass gathers each completion token's hidden state back into the [B, T] layout).

Shapes: B completions, T completion tokens, S row shards, R packed rows per shard of W tokens,
D hidden (see rl_core.train.packing for how sequences are placed).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Packed(NamedTuple):
    """Sequences packed into rows (see the module docstring)."""

    tokens: jax.Array  # [S * R, W] int32 (0 where no segment)
    positions: jax.Array  # [S * R, W] int32, restarting at 0 in each segment
    segments: jax.Array  # [S * R, W] int32: 0 = padding, k >= 1 = the row's k-th sequence
    index: jax.Array  # [B, T] int32: flat index r * W + w, within its block's R rows, of the
    # token that predicts completion token t

    def attention_mask(self) -> jax.Array:
        """[S * R, W, W]: causal within each segment; padding attends to nothing."""
        seg = self.segments
        w = seg.shape[-1]
        causal = jnp.tril(jnp.ones((w, w), bool))
        return causal & (seg[..., :, None] == seg[..., None, :]) & (seg[..., None, :] > 0)


def unpack(hidden: jax.Array, index: jax.Array, shards: int = 1) -> jax.Array:
    """[B, T, D] hidden states at `index` [B, T] from packed rows [S * R, W, D] of `shards`
    blocks: a gather batched over the blocks, so a block split over devices stays local."""
    d = hidden.shape[-1]
    b, t = index.shape
    blocks = hidden.reshape(shards, -1, d)  # [S, R * W, D]
    local = jax.vmap(lambda h, i: h[i])(blocks, index.reshape(shards, b // shards, t))
    return local.reshape(b, t, d)
