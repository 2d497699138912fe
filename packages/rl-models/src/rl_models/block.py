"""One decoder block of the transformer (rl_models.transformer) and its parts: grouped-query
self-attention with rotary positions over the model's KV cache (`Attention`), the gated MLP, and
the pre-norm residual `Block`, whose parameters `stack_layers` stacks on a leading layer axis.

Shapes as in rl_models.transformer. The attention kernels are rl_models.attention's; a windowed
layer's ring of key/value slots is rl_models.rings'.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec

from rl_models import attention as attention_lib
from rl_models.attention import attend, attend_sequence
from rl_models.config import TransformerConfig
from rl_models.layers import Linear, RMSNorm, fused_linear, param
from rl_models.moe import MoE, Routing
from rl_models.rings import held_slots, key_mask, write_call
from rl_models.rope import LANES, rotate, rotate_lanes
from rl_models.sharding import constrain

ROWS = ("act_batch", "act_length", "act_embed")
"""Logical axes of the residual stream [B, L, D] (rl_models.sharding)."""

# (k, v): each [layers, B, K, S, Dh] when the layers are scanned (a `LaneKV` for heads narrower
# than a vector's lanes); unrolled, a tuple of one [B, K, S, Dh] buffer per layer (each layer
# reads its own, no slice of a stack copied per token)
KVCache = tuple[jax.Array, jax.Array] | tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]
KVCacheAxes = tuple[PartitionSpec, PartitionSpec] | tuple[tuple[PartitionSpec, ...], tuple[PartitionSpec, ...]]

class LaneKV(NamedTuple):
    """A scanned model's (k, v) cache with each slot's KV heads side by side, each [layers, B, S,
    K * Dh], for heads narrower than 128 lanes (`lane_packed`).

    Head-major [.., K, S, Dh] with Dh = 64 leaves half of every 128-lane tile empty, and XLA:TPU lays
    such a stack out rows-minor for the in-place write of each token, then slices and relays each
    layer's cache out of it for the attention's dot at every decode step (on a v5e, a third of the
    0.5B shape's decode step). Lane-packed, a slot's heads fill whole tiles, the dots read the layer
    as it is stored, and a decode step's attention (`attend_lanes`) contracts over whole 128-lane
    groups; the new keys are rotated by `rotate_lanes`, which keeps them lanes-minor. A 0.5B decode
    step of 128 rows on a v5e: 5.57 ms in the heads' layout, 3.96 lane-packed
    (docs/results/2026-12-07-tpu-chip-thirteenth.md)."""

    k: jax.Array
    v: jax.Array


def lane_packed(config: TransformerConfig) -> bool:
    """Whether a scanned model of `config` keeps a `LaneKV`: heads narrower than 128 lanes that fill
    whole ones side by side (Dh divides 128, K * Dh a multiple of 128), as Qwen2.5-0.5B's 2 of 64,
    unless `rl_models.attention.DECODE_ATTENTION` asks for another way (to measure)."""
    dh, kv_heads = config.head_dim, config.num_kv_heads
    assert dh is not None
    return attention_lib.DECODE_ATTENTION == "lanes" and dh < LANES and LANES % dh == 0 and kv_heads * dh % LANES == 0

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def compute_dtype(config: TransformerConfig) -> jnp.dtype:
    """The jnp dtype of activations, matmuls and the KV cache (`config.dtype`)."""
    return jnp.dtype(_DTYPES[config.dtype])


def param_dtype(config: TransformerConfig) -> jnp.dtype:
    """The jnp dtype parameters are stored in (`config.param_dtype`)."""
    return jnp.dtype(_DTYPES[config.param_dtype])


def within_window(mask: jax.Array, window: int | jax.Array, first_slot: jax.Array | int) -> jax.Array:
    """`mask` [B, Lq, S] with each query (at slots first_slot..) kept to the `window` key slots
    ending at its own, as transformers' sliding-window mask (kv > q - window, by cache slot)."""
    q_slots = jnp.asarray(first_slot, jnp.int32) + jnp.arange(mask.shape[1], dtype=jnp.int32)
    near = q_slots[:, None] - jnp.arange(mask.shape[2], dtype=jnp.int32)[None, :] < window
    return mask & near[None]


def write_cache(kv: KVCache, k: jax.Array, v: jax.Array, layer: jax.Array | int, cache_index: jax.Array | int
                ) -> tuple[KVCache, jax.Array, jax.Array]:
    """(the cache [layers, B, K, S, Dh] each with k / v [B, L, K, Dh] written in place at `layer`,
    slots cache_index.., then that layer's keys and values [B, K, S, Dh]; of a `LaneKV`, [B, S, K * Dh])."""
    zero = jnp.zeros((), jnp.int32)
    if isinstance(kv, LaneKV):
        start = (jnp.asarray(layer, jnp.int32), zero, jnp.asarray(cache_index, jnp.int32), zero)
        new = [x.reshape(*x.shape[:2], -1)[None].astype(kv.k.dtype) for x in (k, v)]  # [1, B, L, K * Dh]
        kv = LaneKV(jax.lax.dynamic_update_slice(kv.k, new[0], start), jax.lax.dynamic_update_slice(kv.v, new[1], start))
        k_all, v_all = (jax.lax.dynamic_index_in_dim(c, layer, axis=0, keepdims=False) for c in kv)
        return kv, k_all, v_all
    start = (jnp.asarray(layer, jnp.int32), zero, zero, jnp.asarray(cache_index, jnp.int32), zero)
    new = [x.transpose(0, 2, 1, 3)[None].astype(kv[0].dtype) for x in (k, v)]  # [1, B, K, L, Dh]
    kv = (jax.lax.dynamic_update_slice(kv[0], new[0], start), jax.lax.dynamic_update_slice(kv[1], new[1], start))
    k_all, v_all = (jax.lax.dynamic_index_in_dim(c, layer, axis=0, keepdims=False) for c in kv)
    return kv, k_all, v_all


def attend_lanes(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float | None,
                 softcap: float | None, sinks: jax.Array | None = None) -> jax.Array:
    """A decode step's attention of q [B, 1, H, Dh] over one layer of a `LaneKV`, k / v [B, S, K * Dh],
    where mask [B, 1, S] holds -> [B, 1, H * Dh]; the numbers of `attend` (with `sinks` [H], its).

    Each group of 128 lanes holds 128 / Dh heads. A query is set beside zeros in the lanes of its
    group's other heads, so its scores are one dot over the group's whole lanes (the zeros add
    nothing), and the values' product is a dot over the slots giving every lane of the group, of
    which each query keeps its own head's. The arithmetic is 128 / Dh times the heads' own; a decode
    step reads each cached byte once either way, and it is bound by those reads."""
    b, _, h, dh = q.shape
    slots, width = k.shape[1], k.shape[2]
    groups, per = width // LANES, LANES // dh
    g = h // (width // dh)  # query heads a KV head
    scale = 1.0 / math.sqrt(dh) if scale is None else scale
    own = jnp.eye(per, dtype=q.dtype)
    qg = q.reshape(b, groups, per, g, dh)  # KV head j * per + p's queries
    wide = (qg[:, :, :, :, None, :] * own[None, None, :, None, :, None]).reshape(b, groups, per * g, LANES)
    k, v = k.reshape(b, slots, groups, LANES), v.reshape(b, slots, groups, LANES)
    scores = jnp.einsum("bjrc,bsjc->bjrs", wide, k, preferred_element_type=jnp.float32) * scale
    scores = attention_lib.soft_capped(scores, softcap)
    scores = jnp.where(mask[:, None], scores, jnp.finfo(jnp.float32).min)
    if sinks is None:
        probs = jax.nn.softmax(scores, axis=-1)
    else:  # rows in the queries' order: group j, its head p, that head's query g
        probs = attention_lib.softmax_with_sinks(scores, sinks.astype(jnp.float32).reshape(groups, per * g)[None])
    out = jnp.einsum("bjrs,bsjc->bjrc", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
    out = jnp.einsum("bjpgqd,pq->bjpgd", out.reshape(b, groups, per, g, per, dh), own.astype(jnp.float32))
    return out.reshape(b, 1, h * dh).astype(v.dtype)


LIVE_BLOCKS = 8
"""A decode step's attention reads the cache in at most this many blocks of slots, only as many as
hold a live slot (`attend_live`)."""
BLOCK_SLOTS = 128
"""A block's slots are a multiple of this (a TPU vector register's lanes)."""


def attend_live(q: jax.Array, kv: KVCache, layer: jax.Array | int, mask: jax.Array, live: jax.Array,
                scale: float | None, softcap: float | None) -> jax.Array:
    """A decode step's attention of q [B, 1, H, Dh] over layer `layer` of the stacked cache `kv` (each
    [layers, B, K, S, Dh]) -> [B, 1, H * Dh], reading only the blocks of slots that hold slots
    0..live-1 (an online softmax over them, as flash decoding). `mask` [B, 1, S] must hide the slots
    from `live` on (a decode loop's have not been written yet).

    The static engine's cache holds every slot a completion may reach (P + T); a masked attention over
    all of them read about twice the live cache over a rollout that runs to its end. Each block is
    sliced out of the stack inside the loop, where XLA fuses the slice into its reads (a layer sliced
    out before it would be a copy). The values' product is a multiply and a float32 sum, not a dot: one
    query row per head makes it a matrix-vector product, memory-bound either way, and as a dot XLA:TPU
    wants the values slots-minor where the in-place write of the new token lays them out otherwise, so
    it copied and transposed every layer's values at every step (docs/results/2026-12-06-decode-hlo.md);
    the sum reads them in whatever layout they have."""
    b, _, h, dh = q.shape
    _, _, kv_heads, slots, _ = kv[0].shape
    g = h // kv_heads
    width = min(slots, -(-(-(-slots // LIVE_BLOCKS)) // BLOCK_SLOTS) * BLOCK_SLOTS)
    scale = 1.0 / math.sqrt(dh) if scale is None else scale
    qg = q.reshape(b, kv_heads, g, dh)
    layer = jnp.asarray(layer, jnp.int32)
    zero = jnp.zeros((), jnp.int32)

    def block(j, carry):
        top, total, acc = carry  # running max [B, K, G], denominator [B, K, G], numerator [B, K, G, Dh]
        start = jnp.minimum(j * width, slots - width)  # the last block ends at the last slot (it may overlap)
        k, v = (jax.lax.dynamic_slice(x, (layer, zero, zero, start, zero), (1, b, kv_heads, width, dh))[0] for x in kv)
        s = jnp.einsum("bkgd,bksd->bkgs", qg, k, preferred_element_type=jnp.float32) * scale
        s = attention_lib.soft_capped(s, softcap)
        at = start + jnp.arange(width, dtype=jnp.int32)
        seen = jax.lax.dynamic_slice_in_dim(mask[:, 0], start, width, axis=1) & (at >= j * width)[None]  # [B, W]
        s = jnp.where(seen[:, None, None, :], s, -jnp.inf)
        new_top = jnp.maximum(top, jnp.max(s, axis=-1))
        safe_top = jnp.where(jnp.isfinite(new_top), new_top, 0.0)  # a block with none of a row's slots
        p = jnp.exp(s - safe_top[..., None])
        correction = jnp.exp(top - safe_top)
        pv = jnp.sum(p.astype(v.dtype)[..., None].astype(jnp.float32) * v[:, :, None].astype(jnp.float32), axis=-2)
        return new_top, total * correction + jnp.sum(p, axis=-1), acc * correction[..., None] + pv

    init = (jnp.full((b, kv_heads, g), -jnp.inf, jnp.float32), jnp.zeros((b, kv_heads, g), jnp.float32),
            jnp.zeros((b, kv_heads, g, dh), jnp.float32))
    blocks = jnp.clip((live + width - 1) // width, 1, -(-slots // width))
    _, total, acc = jax.lax.fori_loop(0, blocks, block, init)
    # every row sees its own slot in a decode loop; a row that sees none gets zeros, not NaN
    return (acc / jnp.where(total > 0, total, 1.0)[..., None]).reshape(b, 1, h * dh).astype(kv[1].dtype)


class Attention(nnx.Module):
    """Grouped-query self-attention with rotary positions (optionally q/k/v and o_proj biases
    and q/k RMSNorm)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        dtypes = {"dtype": compute_dtype(config), "param_dtype": param_dtype(config)}
        d, h, kv, dh = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        assert dh is not None
        bias = config.attention_bias
        # the fused (heads x head_dim) output axes are named for the heads they hold
        # ... and split only in whole heads (units of head_dim)
        heads = {"use_bias": bias, "units": (1, dh), **dtypes, "rngs": rngs}
        self.q_proj = Linear(d, h * dh, axes=("embed", "heads"), **heads)
        self.k_proj = Linear(d, kv * dh, axes=("embed", "kv_heads"), **heads)
        self.v_proj = Linear(d, kv * dh, axes=("embed", "kv_heads"), **heads)
        self.o_proj = Linear(h * dh, d, axes=("heads", "embed"), use_bias=config.attention_out_bias, units=(dh, 1),
                             **dtypes, rngs=rngs)
        self.sinks = param(jnp.zeros((h,), param_dtype(config)), ("heads",)) if config.attention_sinks else None
        eps, pdt = config.rms_norm_eps, param_dtype(config)
        norm = {"eps": eps, "param_dtype": pdt, "axis": "head_dim", "plus_one": config.norm_plus_one}
        widths = (dh, dh)
        if config.qk_norm_all_heads:  # OLMo 2's: over the whole projection (replicated, as other norms)
            norm["axis"], widths = "norm", (h * dh, kv * dh)
        self.q_norm = RMSNorm(widths[0], **norm) if config.qk_norm else None
        self.k_norm = RMSNorm(widths[1], **norm) if config.qk_norm else None
        self.config = config

    def normed(self, q: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
        """q [..., H, Dh] and k [..., K, Dh] through the q/k norms (unchanged without them): over
        each head's Dh, or with `qk_norm_all_heads` over all heads' H * Dh (K * Dh) at once."""
        if self.q_norm is None or self.k_norm is None:
            return q, k
        if not self.config.qk_norm_all_heads:
            return self.q_norm(q), self.k_norm(k)
        return (self.q_norm(q.reshape(*q.shape[:-2], -1)).reshape(q.shape),
                self.k_norm(k.reshape(*k.shape[:-2], -1)).reshape(k.shape))

    def __call__(self, x: jax.Array, rope: tuple[jax.Array, jax.Array], mask: jax.Array,
                 kv: KVCache | None, cache_index: jax.Array | int, layer: jax.Array,
                 queries_from: int = 0, window: int | jax.Array | None = None) -> tuple[jax.Array, KVCache | None]:
        """`kv` is the whole stacked cache; this layer writes and reads its slice
        `layer` in place (a loop-carried buffer, so decoding copies no cache).

        Every position gives a key and value; only positions `queries_from`.. ask a query,
        so the output is [B, L - queries_from, D] (the last block's, when no later position
        reads the earlier ones' outputs). `window` (key slots; None: every earlier one) keeps
        each query to its sliding window (the paged engine's attention reads only the window's
        pages; this cache path masks the rest)."""
        cfg = self.config
        b, l, _ = x.shape
        h, kvh, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        lq = l - queries_from
        if l == 1:  # decoding: one matmul instead of three (fewer, larger ops per token)
            qkv = fused_linear(x, (self.q_proj, self.k_proj, self.v_proj))
            q, k, v = qkv[..., : h * dh], qkv[..., h * dh : (h + kvh) * dh], qkv[..., (h + kvh) * dh :]
        else:  # separate matmuls: their backward needs no pad/add of sliced gradients
            q, k, v = self.q_proj(x[:, queries_from:]), self.k_proj(x), self.v_proj(x)
        q, k, v = q.reshape(b, lq, h, dh), k.reshape(b, l, kvh, dh), v.reshape(b, l, kvh, dh)
        q = constrain(q, ("act_batch", "act_length", "act_heads", None))
        k, v = (constrain(x, ("act_batch", "act_length", "act_kv_heads", None)) for x in (k, v))
        q, k = self.normed(q, k)
        lanes = isinstance(kv, LaneKV)
        # a decode step's keys written to a lane-packed cache stay lanes-minor (rotate_lanes)
        rotate_keys = rotate_lanes if lanes and l == 1 else rotate
        q, k = rotate(q, *(r[:, queries_from:] for r in rope)), rotate_keys(k, *rope)
        ring = kv is not None and not lanes and window is not None and kv[0].shape[3] < mask.shape[-1]
        if ring:  # rl_models.rings
            out, kv = self._ring_attention(q, k, v, mask, kv, cache_index, layer, queries_from, window)
            return self.o_proj(out), kv
        mask = mask[:, queries_from:]
        if window is not None:
            mask = within_window(mask, window, cache_index + queries_from)
        scale, windowed, cap = cfg.query_scale, window is not None, cfg.attn_logit_softcapping
        sinks = None if self.sinks is None else self.sinks[...]
        if kv is None:
            out = attend_sequence(q, k, v, mask, cfg.attention, offset=queries_from, scale=scale, windowed=windowed,
                                  sinks=sinks, softcap=cap)
            return self.o_proj(constrain(out, ("act_batch", "act_length", "act_heads"))), None
        kv, k_all, v_all = write_cache(kv, k, v, layer, cache_index)
        if lanes and l == 1:
            return self.o_proj(attend_lanes(q, k_all, v_all, mask, scale, cap, sinks)), kv
        if lanes:  # a prompt's queries (once a rollout): the layer in the heads' layout
            k_all, v_all = (x.reshape(b, x.shape[1], kvh, dh).transpose(0, 2, 1, 3) for x in (k_all, v_all))
        # a windowed layer masks the slots before its window (any read of a slice of the cache next
        # to its in-place update makes XLA:CPU copy the whole cache per token: slower than the mask)
        kind = attention_lib.traced_kernel(cfg.attention, dtype=q.dtype, head_dim=dh,
                                           length=q.shape[1]) if l > 1 else "xla"
        # a decode step on an accelerator reads the live blocks of the cache in place (attend_live)
        in_place = attention_lib.DECODE_ATTENTION == "live" and attention_lib.target_platform() != "cpu"
        if l == 1 and sinks is None and in_place:  # (a LaneKV only with "lanes")
            out = attend_live(q, kv, layer, mask, jnp.asarray(cache_index, jnp.int32) + 1, scale, cap)
        elif kind == "xla" or sinks is not None or (kind == "splash" and (windowed or not isinstance(cache_index, int))):
            out = attend(q, k_all, v_all, mask, scale, sinks, cap)  # the cache's layout
        else:  # prefill through the fused kernel (Splash's causal blocks need a static offset)
            offset = cache_index + queries_from if isinstance(cache_index, int) else 0
            out = attend_sequence(q, k_all.transpose(0, 2, 1, 3), v_all.transpose(0, 2, 1, 3), mask,
                                  cfg.attention, offset=offset, scale=scale, softcap=cap)
        return self.o_proj(out), kv

    def _ring_attention(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, kv: KVCache,
                        cache_index: jax.Array | int, layer: jax.Array, queries_from: int,
                        window: int | jax.Array) -> tuple[jax.Array, KVCache]:
        """A windowed layer over its ring `kv` (each [layers, B, K, R, Dh], R < S): the attention
        output [B, Lq, H * Dh] and the ring with the call's keys and values (rl_models.rings)."""
        r = kv[0].shape[3]
        if not isinstance(window, int) or r < window:  # Transformer._cache_slots lets no such cache through
            raise ValueError(f"a {r}-slot ring cannot hold a window of {window} slots")
        cfg = self.config
        length = k.shape[1]
        c = jnp.asarray(cache_index, jnp.int32)
        layer = jnp.asarray(layer, jnp.int32)
        zero = jnp.zeros((), jnp.int32)
        sinks = None if self.sinks is None else self.sinks[...]
        new = [x.transpose(0, 2, 1, 3).astype(kv[0].dtype) for x in (k, v)]  # [B, K, L, Dh]
        if length == 1:  # decoding: written over the slot it replaces, then the whole ring read in place
            start = (layer, zero, zero, jnp.mod(c, r), zero)
            kv = (jax.lax.dynamic_update_slice(kv[0], new[0][None], start),
                  jax.lax.dynamic_update_slice(kv[1], new[1][None], start))
            k_all, v_all = (jax.lax.dynamic_index_in_dim(x, layer, axis=0, keepdims=False) for x in kv)
            return attend(q, k_all, v_all, key_mask(mask, held_slots(c, r), c[None], window), cfg.query_scale,
                          sinks, cfg.attn_logit_softcapping), kv
        rings = [jax.lax.dynamic_index_in_dim(x, layer, axis=0, keepdims=False) for x in kv]  # [B, K, R, Dh]
        slots, keys, values = c + jnp.arange(length, dtype=jnp.int32), new[0], new[1]
        if not (isinstance(cache_index, int) and cache_index == 0):  # the ring's slots before this call too
            slots = jnp.concatenate([held_slots(c - 1, r), slots])
            keys, values = (jnp.concatenate([ring, x], axis=2) for ring, x in zip(rings, new))
        queries = c + queries_from + jnp.arange(length - queries_from, dtype=jnp.int32)
        out = attend_sequence(q, keys.transpose(0, 2, 1, 3), values.transpose(0, 2, 1, 3),
                              key_mask(mask[:, queries_from:], slots, queries, window), cfg.attention,
                              scale=cfg.query_scale, windowed=True, sinks=sinks, softcap=cfg.attn_logit_softcapping)
        start = (layer, zero, zero, zero, zero)
        kv = tuple(jax.lax.dynamic_update_slice(x, write_call(ring, n, c)[None], start)
                   for x, ring, n in zip(kv, rings, new))
        return out, kv  # type: ignore[return-value]


ACTIVATION_FUNCTIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "silu": jax.nn.silu,
    "gelu_tanh": partial(jax.nn.gelu, approximate=True),  # torch's gelu(approximate="tanh")
}


class MLP(nnx.Module):
    """A gated MLP: down(act(gate(x)) * up(x)); SwiGLU with silu, GeGLU with gelu_tanh; each
    projection with a bias when `mlp_bias`."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        dtypes = {"dtype": compute_dtype(config), "param_dtype": param_dtype(config)}
        d, f = config.hidden_size, config.mlp_hidden_size
        bias = config.mlp_bias
        self.gate_proj = Linear(d, f, axes=("embed", "mlp"), use_bias=bias, **dtypes, rngs=rngs)
        self.up_proj = Linear(d, f, axes=("embed", "mlp"), use_bias=bias, **dtypes, rngs=rngs)
        self.down_proj = Linear(f, d, axes=("mlp", "embed"), use_bias=bias, **dtypes, rngs=rngs)
        self.act = config.hidden_act

    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATION_FUNCTIONS[self.act]
        if x.shape[1] != 1:
            names = ("act_batch", "act_length", "act_mlp")
            return self.down_proj(act(constrain(self.gate_proj(x), names)) * constrain(self.up_proj(x), names))
        gate_up = fused_linear(x, (self.gate_proj, self.up_proj))  # decoding: one matmul
        f = self.gate_proj.kernel.shape[-1]
        return self.down_proj(act(gate_up[..., :f]) * gate_up[..., f:])


def feed_forward(config: TransformerConfig, *, rngs: nnx.Rngs) -> MLP | MoE:
    """A block's MLP: the gated MLP, or with experts the MoE (and, with `shared_expert`, the gated
    MLP as its shared expert)."""
    if not config.num_experts:
        return MLP(config, rngs=rngs)
    return MoE(config, rngs=rngs, shared_expert=MLP(config, rngs=rngs) if config.shared_expert else None)


def norm(config: TransformerConfig) -> RMSNorm:
    """An RMSNorm over the hidden size, in the config's style."""
    return RMSNorm(config.hidden_size, eps=config.rms_norm_eps, param_dtype=param_dtype(config),
                   plus_one=config.norm_plus_one)


def normed(norm: RMSNorm | None, x: jax.Array) -> jax.Array:
    """x through `norm`, or x itself where a block has no norm there."""
    return x if norm is None else norm(x)


class Block(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)); x + mlp(norm(x)). With `sandwich_norms`
    each sub-layer's output is normed too before it is added (Gemma's); with `post_norms` only
    the output is (OLMo 2's: x + norm(attn(x)); x + norm(mlp(x)))."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.attn_norm = None if config.post_norms else norm(config)
        self.attn = Attention(config, rngs=rngs)
        self.mlp_norm = None if config.post_norms else norm(config)
        self.mlp = feed_forward(config, rngs=rngs)
        after = config.sandwich_norms or config.post_norms
        self.attn_post_norm = norm(config) if after else None
        self.mlp_post_norm = norm(config) if after else None

    def __call__(self, x: jax.Array, rope: tuple[jax.Array, jax.Array], mask: jax.Array,
                 kv: KVCache | None, cache_index: jax.Array | int, layer: jax.Array,
                 queries_from: int = 0, window: int | jax.Array | None = None, replay: jax.Array | None = None
                 ) -> tuple[jax.Array, KVCache | None, Routing | None]:
        """The block's output at positions `queries_from`.. (see `Attention`), and with experts
        their routing there (None for a dense MLP); `replay` [B, L - queries_from, k] forces it."""
        h, kv = self.attn(normed(self.attn_norm, x), rope, mask, kv, cache_index, layer, queries_from, window)
        x = constrain(x[:, queries_from:] + normed(self.attn_post_norm, h), ROWS)
        routing = None
        if isinstance(self.mlp, MoE):
            h, routing = self.mlp.routed(normed(self.mlp_norm, x), replay)
        else:
            h = self.mlp(normed(self.mlp_norm, x))
        return constrain(x + normed(self.mlp_post_norm, h), ROWS), kv, routing


def stack_layers(blocks: list[Block]) -> Block:
    """One Block whose every parameter is the blocks' parameters stacked on a new
    leading axis (logical name "layers"), the layout `lax.scan` runs over."""
    graphdef, first = nnx.split(blocks[0])
    states = [first, *(nnx.state(b) for b in blocks[1:])]

    def stack(*variables: nnx.Variable) -> nnx.Variable:
        axes = variables[0].get_metadata("out_sharding")
        units = variables[0].get_metadata("axis_units")
        value = jnp.stack([v[...] for v in variables])
        return variables[0].replace(value, out_sharding=("layers", *axes), axis_units=(1, *units))

    stacked = jax.tree.map(stack, *states, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.merge(graphdef, stacked)
