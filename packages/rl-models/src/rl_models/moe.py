"""A mixture-of-experts MLP: a router picks k of E gated MLPs per token; their outputs, weighted by
the router, are summed.

Shapes: N tokens (B * L flattened), D hidden, E experts, k experts per token, F each expert's
inner width.

The experts run as grouped matmuls (`jax.lax.ragged_dot`; tiled on CPU): the N * k (token, expert) pairs are
sorted by expert, so each expert multiplies only the rows routed to it, one contiguous group per
expert. No all-experts product is formed, so the work follows the active parameters (k * F per
token), not the total (E * F). Routing is returned beside the output (`Routing`): the chosen
experts, for routing replay (a training forward that takes the rollout's choices instead of its
own), and the router's probabilities, for the load-balancing loss (`load_balancing_loss`).

Routers (`TransformerConfig.router`): "softmax_topk" (Qwen3-MoE) takes a float32 softmax over all
E logits, then the top k, renormalised to sum to 1 with `norm_topk_prob`; "topk_softmax"
(gpt-oss) takes the top k logits, then a softmax over those k.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rl_models.attention import target_platform
from rl_models.config import TransformerConfig
from rl_models.layers import Linear, param
from rl_models.sharding import gathered


class Routing(NamedTuple):
    """What a router decided for each token; the model stacks one per layer in front."""

    experts: jax.Array
    """[..., k] int32: the chosen experts, in the router's order (best first)."""
    probs: jax.Array
    """[..., E] float32: softmax over every expert's logit (what the load-balancing loss reads)."""


def route(logits: jax.Array, k: int, router: str, norm_topk_prob: bool,
          replay: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(experts [N, k] int32, their weights [N, k] float32, probs [N, E] float32) of router
    logits [N, E]. With `replay` [N, k] the experts are those, not the top k (routing replay); their
    weights are computed from these logits as the chosen ones would be. A replay row whose first
    entry is negative (-1: nothing recorded there) keeps the router's own choice."""
    logits = logits.astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    if replay is not None:  # the rows with nothing recorded take the router's own top k
        own = jax.lax.top_k(probs if router == "softmax_topk" else logits, k)[1]
        replay = jnp.where(replay[:, :1] >= 0, replay, own)
    if router == "softmax_topk":
        if replay is None:
            weights, experts = jax.lax.top_k(probs, k)
        else:
            experts = replay
            weights = jnp.take_along_axis(probs, experts, axis=-1)
        if norm_topk_prob:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        return experts.astype(jnp.int32), weights, probs
    if replay is None:
        top, experts = jax.lax.top_k(logits, k)
    else:
        experts = replay
        top = jnp.take_along_axis(logits, experts, axis=-1)
    return experts.astype(jnp.int32), jax.nn.softmax(top, axis=-1), probs


def load_balancing_loss(probs: jax.Array, experts: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Switch Transformer's auxiliary loss, E * sum_e f_e * P_e, as transformers computes it for
    Qwen3-MoE and gpt-oss (every layer's tokens pooled): f_e is the share of tokens that chose
    expert e (summed over the k choices, so sum_e f_e = k) and P_e the mean router probability of e.
    probs [..., E], experts [..., k], mask [...] (1 = a real token; None: every token). Uniform
    routing gives k; every token sent to the same k experts with certainty gives E."""
    e = probs.shape[-1]
    probs = probs.reshape(-1, e)
    chosen = jax.nn.one_hot(experts.reshape(-1, experts.shape[-1]), e, dtype=jnp.float32).sum(axis=1)  # [N, E]
    m = jnp.ones(probs.shape[:1], jnp.float32) if mask is None else jnp.broadcast_to(
        jnp.asarray(mask, jnp.float32), experts.shape[:-1]).reshape(-1)
    count = jnp.maximum(jnp.sum(m), 1.0)
    f = jnp.sum(chosen * m[:, None], axis=0) / count
    p = jnp.sum(probs * m[:, None], axis=0) / count
    return e * jnp.sum(f * p)


def grouped_experts(x: jax.Array, experts: jax.Array, num_experts: int,
                    matmuls) -> jax.Array:
    """The k expert outputs [N, k, D] of tokens x [N, D] routed to `experts` [N, k]: the N * k
    (token, expert) rows sorted by expert, `matmuls(rows [N*k, D], group_sizes [E], row_experts
    [N*k])` run over them as grouped matmuls, and the results put back in (token, choice) order."""
    n, k = experts.shape
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # rows grouped by expert, each group in token order
    sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    rows = jnp.take(x, order // k, axis=0)
    out = matmuls(rows, sizes, jnp.take(flat, order))
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(n * k, dtype=order.dtype))
    return jnp.take(out, inverse, axis=0).reshape(n, k, -1)


TILE_ROWS = 32
"""Rows per tile of `tiled_grouped_matmul` (each expert's group padded to whole tiles)."""


def tiled_grouped_matmul(rows: jax.Array, w: jax.Array, sizes: jax.Array, tile: int = TILE_ROWS) -> jax.Array:
    """`jax.lax.ragged_dot(rows, w, sizes)` as XLA:CPU runs it well: rows [M, in] sorted by group
    (sizes [E], summing to M), w [E, in, out] -> [M, out]. Each group is padded to whole tiles of
    `tile` rows, and each tile is multiplied by its own group's weight (one batched matmul over
    at most M / tile + E tiles), so the work is the routed rows plus at most a tile per expert.
    JAX lowers ragged_dot on CPU to a product of every row with every group's weight (masked),
    whose time grows with E (docs/results/2026-12-04-moe-speed.md)."""
    m, n_in = rows.shape
    e = w.shape[0]
    tiles = -(-m // tile) + e  # a static bound: each group wastes less than one tile
    padded = -(-sizes // tile) * tile
    starts = jnp.cumsum(sizes) - sizes
    padded_ends = jnp.cumsum(padded)
    group = jnp.repeat(jnp.arange(e), sizes, total_repeat_length=m)
    dest = (padded_ends - padded)[group] + jnp.arange(m) - starts[group]  # each row's place among the tiles
    buf = jnp.zeros((tiles * tile, n_in), rows.dtype).at[dest].set(rows)
    tile_group = jnp.minimum(jnp.searchsorted(padded_ends, jnp.arange(tiles) * tile, side="right"), e - 1)
    out = jnp.einsum("tbi,tio->tbo", buf.reshape(tiles, tile, n_in), jnp.take(w, tile_group, axis=0),
                     preferred_element_type=rows.dtype)
    return jnp.take(out.reshape(tiles * tile, -1), dest, axis=0)


def grouped_matmul(rows: jax.Array, w: jax.Array, sizes: jax.Array) -> jax.Array:
    """The grouped matmul of rows sorted by group: `jax.lax.ragged_dot` (a grouped kernel on
    accelerators), `tiled_grouped_matmul` on CPU."""
    if target_platform() == "cpu":
        return tiled_grouped_matmul(rows, w, sizes)
    return jax.lax.ragged_dot(rows, w, sizes)


class MoE(nnx.Module):
    """The block's MLP as E gated experts (SwiGLU, or gpt-oss's clamped form) behind a router
    (see the module docstring).

    Parameters: router [D, E] (a Linear, with gpt-oss's bias); gate_proj / up_proj [E, D, F] and
    down_proj [E, F, D], with gpt-oss's biases gate_bias / up_bias [E, F] and down_bias [E, D];
    logical axes ("experts", ...), so a mesh rule can place the experts on their own axis."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        dtype, pdt = jnp.dtype(config.dtype), jnp.dtype(config.param_dtype)
        d, e, f = config.hidden_size, config.num_experts, config.moe_hidden_size
        assert f is not None
        self.router = Linear(d, e, axes=("embed", None), use_bias=config.router_bias, dtype=dtype, param_dtype=pdt,
                             rngs=rngs)
        init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
        self.gate_proj = param(init(rngs.params(), (e, d, f), pdt), ("experts", "embed", "mlp"))
        self.up_proj = param(init(rngs.params(), (e, d, f), pdt), ("experts", "embed", "mlp"))
        self.down_proj = param(init(rngs.params(), (e, f, d), pdt), ("experts", "mlp", "embed"))
        biases = config.expert_bias
        self.gate_bias = param(jnp.zeros((e, f), pdt), ("experts", "mlp")) if biases else None
        self.up_bias = param(jnp.zeros((e, f), pdt), ("experts", "mlp")) if biases else None
        self.down_bias = param(jnp.zeros((e, d), pdt), ("experts", "embed")) if biases else None
        self.limit, self.alpha = config.swiglu_limit, config.swiglu_alpha
        self.dtype = dtype
        self.num_experts, self.k = e, config.experts_per_token
        self.router_kind, self.norm_topk_prob = config.router, config.norm_topk_prob

    def weight(self, w: nnx.Param) -> jax.Array:
        """An expert weight [E, in, out] in the compute dtype, laid out for its matmuls."""
        names = w.get_metadata("out_sharding", None) or (None, None, None)
        return gathered(w[...].astype(self.dtype), tuple(names[-3:]))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.routed(x)[0]

    def routed(self, x: jax.Array, replay: jax.Array | None = None) -> tuple[jax.Array, Routing]:
        """(output [B, L, D], Routing with leading [B, L]) of x [B, L, D]; `replay` [B, L, k]
        forces the experts (see `route`)."""
        b, l, d = x.shape
        x2 = x.reshape(-1, d)
        experts, weights, probs = route(self.router(x2), self.k, self.router_kind, self.norm_topk_prob,
                                        None if replay is None else replay.reshape(-1, self.k))
        gate, up, down = (self.weight(w) for w in (self.gate_proj, self.up_proj, self.down_proj))

        def biased(y: jax.Array, bias: nnx.Param | None, row_experts: jax.Array) -> jax.Array:
            return y if bias is None else y + jnp.take(bias[...].astype(y.dtype), row_experts, axis=0)

        def matmuls(rows: jax.Array, sizes: jax.Array, row_experts: jax.Array) -> jax.Array:
            g = biased(grouped_matmul(rows, gate, sizes), self.gate_bias, row_experts)
            u = biased(grouped_matmul(rows, up, sizes), self.up_bias, row_experts)
            if self.limit is None:
                h = jax.nn.silu(g) * u
            else:  # gpt-oss's clamped SwiGLU
                g, u = jnp.minimum(g, self.limit), jnp.clip(u, -self.limit, self.limit)
                h = (u + 1) * (g * jax.nn.sigmoid(g * self.alpha))
            return biased(grouped_matmul(h, down, sizes), self.down_bias, row_experts)

        outs = grouped_experts(x2, experts, self.num_experts, matmuls)  # [N, k, D]
        y = jnp.einsum("nkd,nk->nd", outs, weights.astype(outs.dtype))
        routing = Routing(experts.reshape(b, l, self.k), probs.reshape(b, l, self.num_experts))
        return y.reshape(b, l, d).astype(x.dtype), routing
