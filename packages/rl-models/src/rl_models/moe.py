"""A mixture-of-experts MLP: a router picks k of E gated MLPs per token; their outputs, weighted by
the router, are summed.

Shapes: N tokens (B * L flattened), D hidden, E experts, k experts per token, F each expert's
inner width.

The experts run as grouped matmuls (`jax.lax.ragged_dot`; tiled on CPU): the N * k (token, expert) pairs are
sorted by expert, so each expert multiplies only the rows routed to it, one contiguous group per
expert. No all-experts product is formed, so the work follows the active parameters (k * F per
token), not the total (E * F). Routing is returned beside the output (`Routing`): the chosen
experts, for routing replay (a training forward that takes the rollout's choices instead of its
own), and the router's probabilities, for the load-balancing loss (`rl_core.math.routing`).

On a mesh with an expert axis (`training.mesh.expert`; the logical name act_experts maps to it)
each device holds E / ep of the experts, and `dispatched_experts` sends each (token, expert) pair
to the device holding its expert and the result back, with two all-to-alls per layer; the
numbers are those of one device (tests/algos/test_algo_expert_mesh.py).

Routers (`TransformerConfig.router`): "softmax_topk" (Qwen3-MoE) takes a float32 softmax over all
E logits, then the top k, renormalised to sum to 1 with `norm_topk_prob`; "topk_softmax"
(gpt-oss) takes the top k logits, then a softmax over those k. With `shared_expert` (Qwen3.5-MoE)
every token also goes through one dense gated MLP whose output is scaled by sigmoid(a learned
gate of the token) and added.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rl_models.attention import at_default_precision, target_platform
from rl_models.config import TransformerConfig
from rl_models.layers import Linear, param
from rl_models.sharding import gathered, mesh_axes


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


class ExpertWeights(NamedTuple):
    """One block's expert weights in the compute dtype: kernels [E, in, out], biases [E, out] (None
    without gpt-oss's biases)."""

    gate: jax.Array
    up: jax.Array
    down: jax.Array
    gate_bias: jax.Array | None
    up_bias: jax.Array | None
    down_bias: jax.Array | None


def dispatch_axes(num_experts: int) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(expert axes, row axes, tensor axes) of the mesh being traced, by the logical names
    act_experts, act_batch and act_mlp; no expert axes outside a mesh, or where they do not divide
    the E experts (the weights then stay whole over them, and no tokens move)."""
    experts = mesh_axes("act_experts")
    size = 1
    for a in experts:
        size *= jax.sharding.get_abstract_mesh().shape[a]
    if not experts or num_experts % size:
        return (), (), ()
    return experts, mesh_axes("act_batch"), tuple(a for a in mesh_axes("act_mlp") if a not in experts)


def dispatched_experts(x: jax.Array, experts: jax.Array, w: ExpertWeights, expert_mlp) -> jax.Array:
    """`grouped_experts` with the experts split over the mesh's expert axis (expert parallelism):
    each device routes its own rows' (token, expert) pairs, sends each pair to the device holding
    its expert (an all-to-all), runs its E / ep experts over what it received as grouped matmuls,
    and sends the results back (a second all-to-all). x [N, D], experts [N, k] -> [N, k, D].

    Inside a shard_map over the whole mesh: rows split over the row axes (data, fsdp, expert),
    expert weights split over `expert` on E and over `tensor` on their inner width (the down
    projection's partial sums added over `tensor`). A device may send every one of its n * k
    pairs to one device, so each of its ep send slots holds n * k rows (no pair is ever dropped)."""
    ep_axes, row_axes, tp_axes = dispatch_axes(w.gate.shape[0])
    mesh = jax.sharding.get_abstract_mesh()
    ep = 1
    for a in ep_axes:
        ep *= mesh.shape[a]
    shards = 1
    for a in row_axes:
        shards *= mesh.shape[a]
    n, k = experts.shape
    pad = -n % shards  # rows the row axes do not divide: padded, routed to expert 0, dropped after
    if pad:
        x = jnp.pad(x, ((0, pad), (0, 0)))
        experts = jnp.pad(experts, ((0, pad), (0, 0)))
    num_experts = w.gate.shape[0]
    local = num_experts // ep
    P = jax.sharding.PartitionSpec
    rows, ep_spec = P(row_axes or None), ep_axes if len(ep_axes) > 1 else ep_axes[0]
    tp = (tp_axes if len(tp_axes) > 1 else tp_axes[0]) if tp_axes else None
    specs = ExpertWeights(P(ep_spec, None, tp), P(ep_spec, None, tp), P(ep_spec, tp, None),
                          None if w.gate_bias is None else P(ep_spec, tp),
                          None if w.up_bias is None else P(ep_spec, tp),
                          None if w.down_bias is None else P(ep_spec, None))

    def body(x: jax.Array, experts: jax.Array, w: ExpertWeights) -> jax.Array:
        m, d = x.shape[0] * k, x.shape[1]
        cap = m  # every pair of this device could be for one device
        flat = experts.reshape(-1)
        order = jnp.argsort(flat, stable=True)  # pairs by expert, so by destination device
        sorted_experts = jnp.take(flat, order)
        dest = sorted_experts // local
        slot = jnp.arange(m) - jnp.searchsorted(dest, dest, side="left")  # place among the pairs for dest
        send_at = dest * cap + slot
        send = jnp.zeros((ep * cap, d), x.dtype).at[send_at].set(jnp.take(x, order // k, axis=0))
        # each received row's expert among the device's own; `local` marks an empty slot
        send_expert = jnp.full((ep * cap,), local, jnp.int32).at[send_at].set(sorted_experts % local)
        recv = jax.lax.all_to_all(send, ep_axes, 0, 0, tiled=True)  # [ep * cap, D]: block s from device s
        recv_expert = jax.lax.all_to_all(send_expert, ep_axes, 0, 0, tiled=True)
        # the device's experts, and a zero expert for the empty slots (its rows come out 0)
        padded = jax.tree.map(lambda a: jnp.concatenate([a, jnp.zeros((1, *a.shape[1:]), a.dtype)]), w)
        out = grouped_experts(recv, recv_expert[:, None], local + 1,
                              lambda r, sizes, e: expert_mlp(r, sizes, e, padded, down_bias=False))[:, 0]
        if tp_axes:  # the down projection over this device's share of the inner width
            out = jax.lax.psum(out, tp_axes)
        if w.down_bias is not None:
            out = out + jnp.take(padded.down_bias.astype(out.dtype), recv_expert, axis=0)
        back = jax.lax.all_to_all(out, ep_axes, 0, 0, tiled=True)  # each row to the device it came from
        pairs = jnp.zeros((m, d), out.dtype).at[order].set(jnp.take(back, send_at, axis=0))
        return pairs.reshape(-1, k, d)

    out = jax.shard_map(body, mesh=mesh, in_specs=(rows, rows, specs), out_specs=rows, check_vma=False)(x, experts, w)
    return out[:n] if pad else out


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
    if rows.dtype != jnp.float32:  # a TPU runs ragged_dot as a Mosaic kernel: see at_default_precision
        return at_default_precision(jax.lax.ragged_dot)(rows, w, sizes)
    return jax.lax.ragged_dot(rows, w, sizes)


class MoE(nnx.Module):
    """The block's MLP as E gated experts (SwiGLU, or gpt-oss's clamped form) behind a router
    (see the module docstring).

    Parameters: router [D, E] (a Linear, with gpt-oss's bias); Qwen3.5-MoE's shared_expert (a gated
    MLP, given by the caller) and shared_expert_gate [D, 1], adding sigmoid(gate(x)) * shared(x); gate_proj / up_proj [E, D, F] and
    down_proj [E, F, D], with gpt-oss's biases gate_bias / up_bias [E, F] and down_bias [E, D];
    logical axes ("experts", ...), so a mesh rule can place the experts on their own axis."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, shared_expert: nnx.Module | None = None):
        dtype, pdt = jnp.dtype(config.dtype), jnp.dtype(config.param_dtype)
        d, e, f = config.hidden_size, config.num_experts, config.moe_hidden_size
        assert f is not None
        self.router = Linear(d, e, axes=("embed", None), use_bias=config.router_bias, dtype=dtype, param_dtype=pdt,
                             rngs=rngs)
        # Qwen3.5-MoE's shared expert (a gated MLP every token goes through) and its gate [D, 1]
        self.shared_expert = shared_expert
        self.shared_expert_gate = None if shared_expert is None else Linear(
            d, 1, axes=("embed", None), use_bias=False, dtype=dtype, param_dtype=pdt, rngs=rngs)
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

    def expert_mlp(self, rows: jax.Array, sizes: jax.Array, row_experts: jax.Array, w: ExpertWeights,
                   down_bias: bool = True) -> jax.Array:
        """The gated MLP of each row's expert: rows [M, D] sorted by expert (sizes [E]; row_experts
        [M]) -> [M, D]; `down_bias=False` leaves the down projection's bias to the caller."""

        def biased(y: jax.Array, bias: jax.Array | None) -> jax.Array:
            return y if bias is None else y + jnp.take(bias.astype(y.dtype), row_experts, axis=0)

        g = biased(grouped_matmul(rows, w.gate, sizes), w.gate_bias)
        u = biased(grouped_matmul(rows, w.up, sizes), w.up_bias)
        if self.limit is None:
            h = jax.nn.silu(g) * u
        else:  # gpt-oss's clamped SwiGLU
            g, u = jnp.minimum(g, self.limit), jnp.clip(u, -self.limit, self.limit)
            h = (u + 1) * (g * jax.nn.sigmoid(g * self.alpha))
        y = grouped_matmul(h, w.down, sizes)
        return biased(y, w.down_bias) if down_bias else y

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
        weights_in = ExpertWeights(*(self.weight(w) for w in (self.gate_proj, self.up_proj, self.down_proj)),
                                   *(None if b is None else b[...].astype(self.dtype)
                                     for b in (self.gate_bias, self.up_bias, self.down_bias)))
        if dispatch_axes(self.num_experts)[0]:  # an expert mesh axis: tokens go to their experts' devices
            outs = dispatched_experts(x2, experts, weights_in, self.expert_mlp)
        else:
            outs = grouped_experts(x2, experts, self.num_experts,
                                   lambda rows, sizes, row_experts: self.expert_mlp(rows, sizes, row_experts,
                                                                                    weights_in))  # [N, k, D]
        y = jnp.einsum("nkd,nk->nd", outs, weights.astype(outs.dtype)).reshape(b, l, d)
        if self.shared_expert is not None:
            y = y + jax.nn.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        routing = Routing(experts.reshape(b, l, self.k), probs.reshape(b, l, self.num_experts))
        return y.astype(x.dtype), routing
