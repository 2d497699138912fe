"""A decoder-only transformer (Llama / Qwen / Mistral / Gemma 3 / SmolLM3 / OLMo 2 families) in Flax NNX.

Shapes: B batch, L query tokens, S key/value slots, D hidden, V vocab,
H query heads, K key/value heads, G = H // K queries per KV head, Dh head_dim.

Every piece of state is an `nnx.Param` carrying logical axis names
(`out_sharding` metadata: vocab, embed, heads, kv_heads, head_dim, mlp, norm, and
layers for the stacked layer axis) that a rules table maps to mesh axes. The
blocks are one `Block` whose parameters are stacked on a leading layer axis and
run under `lax.scan` (unrolled on CPU, see `scans_layers`), so a program's size
need not grow with depth. The KV cache
is a plain pair (k, v), each [layers, B, K, S, Dh] (head-major), that callers pass
in and get back, so a jitted sampler can thread it through `lax.while_loop`; the sampler's
(`init_decode_cache`) keeps only a ring of each windowed layer's window (rl_models.rings).
The model adds no implicit causal mask: the caller's `attention_mask` is the
whole truth. Kernels are stored [in, out] (Hugging Face stores [out, in]). `rl_models.lora`
can give projections low-rank adapters (`nnx.LoRAParam`) and store their kernels
quantized; `Linear` applies both. The parameterised layers are in `rl_models.layers`, rotary
embeddings in `rl_models.rope`. The paged rollout engine runs it through the adapter in
`rl_models.paged` (which builds on this module; nothing here knows the engine).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec

from rl_models import attention as attention_lib
from rl_models.config import TransformerConfig
from rl_models.layers import Linear, RMSNorm, fused_linear, param
from rl_models.moe import MoE, Routing
from rl_models.rings import RingKV, held_slots, key_mask, ring_size, scan_ring_layers, write_call
from rl_models.rope import layer_tables, rope_tables, rotate
from rl_models.sharding import constrain, shards

ROWS = ("act_batch", "act_length", "act_embed")
"""Logical axes of the residual stream [B, L, D] (rl_models.sharding)."""

# (k, v): each [layers, B, K, S, Dh] when the layers are scanned; unrolled, a tuple of one
# [B, K, S, Dh] buffer per layer (each layer reads its own, no slice of a stack copied per token)
KVCache = tuple[jax.Array, jax.Array] | tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]
KVCacheAxes = tuple[PartitionSpec, PartitionSpec] | tuple[tuple[PartitionSpec, ...], tuple[PartitionSpec, ...]]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def compute_dtype(config: TransformerConfig) -> jnp.dtype:
    """The jnp dtype of activations, matmuls and the KV cache (`config.dtype`)."""
    return jnp.dtype(_DTYPES[config.dtype])


def param_dtype(config: TransformerConfig) -> jnp.dtype:
    """The jnp dtype parameters are stored in (`config.param_dtype`)."""
    return jnp.dtype(_DTYPES[config.param_dtype])


def scans_layers(config: TransformerConfig) -> bool:
    """Whether the blocks run as a loop (`config.scan_layers`; None: everywhere but on CPU).

    XLA:CPU runs a loop's iterations one after another, each body a separate set of
    kernels with the stacked residuals written and read back through dynamic slices;
    unrolled, it fuses across layers (tiny-qwen2 update, 1 core: 130 -> 77 ms). On
    accelerators the loop keeps compile time and program size flat in depth.
    """
    if config.scan_layers is not None:
        return config.scan_layers
    return attention_lib.target_platform() != "cpu"


def remat_policy(remat: str) -> Callable[..., bool] | None:
    """The `jax.checkpoint` policy of a `TransformerConfig.remat` setting (None: save nothing)."""
    policies = jax.checkpoint_policies
    return {
        "full": None,
        "dots_saveable": policies.dots_saveable,
        "dots_with_no_batch_dims_saveable": policies.dots_with_no_batch_dims_saveable,
        # Linear runs 2-D matmuls (no batch dims): the projections and MLP go to host memory
        "offload": policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
    }[remat]


FULL_WINDOW = 1 << 30
"""The window of a layer that sees every earlier slot (longer than any sequence)."""


def layer_windows(config: TransformerConfig) -> tuple[int, ...]:
    """Each layer's window in key slots (FULL_WINDOW: not windowed)."""
    return tuple(config.sliding_window if w else FULL_WINDOW for w in config.windowed())  # type: ignore[misc]


def within_window(mask: jax.Array, window: int | jax.Array, first_slot: jax.Array | int) -> jax.Array:
    """`mask` [B, Lq, S] with each query (at slots first_slot..) kept to the `window` key slots
    ending at its own, as transformers' sliding-window mask (kv > q - window, by cache slot)."""
    q_slots = jnp.asarray(first_slot, jnp.int32) + jnp.arange(mask.shape[1], dtype=jnp.int32)
    near = q_slots[:, None] - jnp.arange(mask.shape[2], dtype=jnp.int32)[None, :] < window
    return mask & near[None]


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float | None = None,
           sinks: jax.Array | None = None) -> jax.Array:
    """Grouped-query attention over head-major keys and values (the cache's layout).

    q [B, L, H, Dh], k/v [B, K, S, Dh] (the cache's layout), mask [B, L, S]
    (True = may attend) -> [B, L, H * Dh]. Both matmuls are batched over (B, K)
    with the G query heads of a KV head and their L queries as one [G * L] row
    block, so XLA runs plain batched matmuls instead of transposing the cache.
    Scores and softmax run in float32; masked scores are the most negative
    float32, so a fully masked row gets a finite uniform distribution, not NaN.
    On CPU the gradient is `_attention_core_cpu`'s (the same values). `sinks` [H] (gpt-oss): each
    head's extra logit in every query's softmax, which takes probability but adds no value.
    """
    b, l, h, dh = q.shape
    kv_heads = k.shape[1]
    g = h // kv_heads
    q = q.reshape(b, l, kv_heads, g, dh).transpose(0, 2, 3, 1, 4).reshape(b, kv_heads, g * l, dh)
    mask = jnp.broadcast_to(mask[:, None, None], (b, kv_heads, g, l, mask.shape[-1])).reshape(b, kv_heads, g * l, -1)
    scale = 1.0 / math.sqrt(dh) if scale is None else scale
    if sinks is not None:  # head kv * G + i's sink, for its L query rows
        rows = jnp.repeat(sinks.astype(jnp.float32).reshape(kv_heads, g), l, axis=1)  # [K, G * L]
        out = _attention_with_sinks(q, k, v, mask, scale, rows)
    else:
        core = _attention_core_cpu if attention_lib.target_platform() == "cpu" else _attention_core
        out = core(q, k, v, mask, scale)
    out = out.reshape(b, kv_heads, g, l, dh).transpose(0, 3, 1, 2, 4)
    return out.reshape(b, l, h * dh).astype(v.dtype)


def _attention_probs(q: jax.Array, k: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """float32 softmax(q k^T * scale) [B, K, Q, S] over head-major q [B, K, Q, Dh], k [B, K, S, Dh]
    where mask [B, K, Q, S] holds."""
    scores = jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32) * scale
    return jax.nn.softmax(jnp.where(mask, scores, jnp.finfo(jnp.float32).min), axis=-1)


def _attention_with_sinks(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                          sinks: jax.Array) -> jax.Array:
    """float32 [B, K, Q, Dh] attention whose softmax over each row also holds the row's sink
    logit `sinks` [K, Q] (then dropped): p_s = exp(x_s - m) / (sum_s' exp(x_s' - m) + exp(sink - m))."""
    scores = jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    top = jnp.maximum(jnp.max(scores, axis=-1), sinks[None])  # [B, K, Q]
    e = jnp.exp(scores - top[..., None])
    probs = e / (jnp.sum(e, axis=-1) + jnp.exp(sinks[None] - top))[..., None]
    return jnp.einsum("bkqs,bksd->bkqd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)


def _attention_core(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """float32 [B, K, Q, Dh] attention output of head-major q, k, v (see `_attention_probs`)."""
    return _attention_core_fwd(q, k, v, mask, scale)[0]  # the residuals are dead code to XLA


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention_core_cpu(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """`_attention_core` with the gradient autodiff gives, computed so that XLA:CPU runs every
    matmul of it through its matmul library. Autodiff's dk = ds^T q and dv = p^T dout contract
    over the query axis, which is not the minor one of either operand; XLA:CPU runs that form as
    its own batched dot, far slower than the library's. Here ds and p are transposed first, behind
    an optimization barrier so that XLA does not fold the transpose back into the dot (tiny-qwen2
    update 5-8% faster)."""
    return _attention_core(q, k, v, mask, scale)


def _attention_core_fwd(q, k, v, mask, scale):
    """(the output, the residuals `_attention_core_bwd` reads)."""
    probs = _attention_probs(q, k, mask, scale)
    out = jnp.einsum("bkqs,bksd->bkqd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out, (q, k, v, mask, probs)


def _attention_core_bwd(scale, residuals, dout):
    q, k, v, mask, probs = residuals

    def swapped(x: jax.Array) -> jax.Array:  # [B, K, Q, S] -> [B, K, S, Q], materialized
        return jax.lax.optimization_barrier(jnp.swapaxes(x, -1, -2))

    dout = dout.astype(v.dtype)
    dprobs = jnp.einsum("bkqd,bksd->bkqs", dout, v, preferred_element_type=jnp.float32)
    dv = jnp.einsum("bksq,bkqd->bksd", swapped(probs.astype(v.dtype)), dout, preferred_element_type=jnp.float32)
    # softmax's backward, as jax.nn.softmax defines it; masked scores get none (jnp.where's)
    dscores = probs * (dprobs - jnp.sum(dprobs * probs, axis=-1, keepdims=True))
    dscores = (jnp.where(mask, dscores, 0.0) * scale).astype(q.dtype)
    dq = jnp.einsum("bkqs,bksd->bkqd", dscores, k, preferred_element_type=jnp.float32)
    dk = jnp.einsum("bksq,bkqd->bksd", swapped(dscores), q, preferred_element_type=jnp.float32)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_attention_core_cpu.defvjp(_attention_core_fwd, _attention_core_bwd)


def attend_sequence(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                    implementation: str, offset: int = 0, scale: float | None = None,
                    windowed: bool = False, sinks: jax.Array | None = None) -> jax.Array:
    """Grouped-query attention over whole sequences (training, prefill): q [B, L, H, Dh] at key
    slots offset..offset+L-1, k/v [B, S, K, Dh], mask [B, L, S] -> [B, L, H * Dh].

    `implementation` is `TransformerConfig.attention`, resolved for the platform the program is
    traced for (rl_models.attention.traced_kernel). "xla": the head-major batched matmuls of
    `attend` (on XLA:CPU 12% faster over a whole tiny-qwen2 update than
    `jax.nn.dot_product_attention`'s XLA path, whose grouped-query reshapes become strided
    copies); "cudnn" and "splash": the fused kernels. `scale` multiplies the scores (None:
    1 / sqrt(Dh)). Splash builds its mask from causal blocks and segments, which cannot say a
    sliding window: a `windowed` layer's attention runs as xla there, as does any with `sinks`.
    """
    if sinks is not None:  # the fused kernels have no sink logit
        return attend(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask, scale, sinks)
    kind = attention_lib.traced_kernel(implementation, dtype=q.dtype, head_dim=q.shape[-1])
    if scale is not None and kind in ("cudnn", "splash"):  # the kernels scale by 1 / sqrt(Dh): the queries carry the rest
        q = (q.astype(jnp.float32) * (scale * math.sqrt(q.shape[-1]))).astype(q.dtype)
    if kind == "cudnn":
        return attention_lib.cudnn(q, k, v, mask)
    if kind == "splash" and not windowed:
        return attention_lib.splash(q, k, v, mask, offset=offset)
    return attend(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask, scale)


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
        q, k = rotate(q, *(r[:, queries_from:] for r in rope)), rotate(k, *rope)
        if kv is not None and window is not None and kv[0].shape[3] < mask.shape[-1]:  # a ring: rl_models.rings
            out, kv = self._ring_attention(q, k, v, mask, kv, cache_index, layer, queries_from, window)
            return self.o_proj(out), kv
        mask = mask[:, queries_from:]
        if window is not None:
            mask = within_window(mask, window, cache_index + queries_from)
        scale, windowed = cfg.query_scale, window is not None
        sinks = None if self.sinks is None else self.sinks[...]
        if kv is None:
            out = attend_sequence(q, k, v, mask, cfg.attention, offset=queries_from, scale=scale, windowed=windowed,
                                  sinks=sinks)
            return self.o_proj(constrain(out, ("act_batch", "act_length", "act_heads"))), None
        zero = jnp.zeros((), jnp.int32)
        start = (jnp.asarray(layer, jnp.int32), zero, zero, jnp.asarray(cache_index, jnp.int32), zero)
        new = [x.transpose(0, 2, 1, 3)[None].astype(kv[0].dtype) for x in (k, v)]  # [1, B, K, L, Dh]
        kv = (jax.lax.dynamic_update_slice(kv[0], new[0], start),
              jax.lax.dynamic_update_slice(kv[1], new[1], start))
        # a windowed layer masks the slots before its window (any read of a slice of the cache next
        # to its in-place update makes XLA:CPU copy the whole cache per token: slower than the mask)
        k_all, v_all = (jax.lax.dynamic_index_in_dim(c, layer, axis=0, keepdims=False) for c in kv)
        kind = attention_lib.traced_kernel(cfg.attention, dtype=q.dtype, head_dim=dh) if l > 1 else "xla"
        if kind == "xla" or sinks is not None or (kind == "splash" and (windowed or not isinstance(cache_index, int))):
            out = attend(q, k_all, v_all, mask, scale, sinks)  # the cache's layout
        else:  # prefill through the fused kernel (Splash's causal blocks need a static offset)
            offset = cache_index + queries_from if isinstance(cache_index, int) else 0
            out = attend_sequence(q, k_all.transpose(0, 2, 1, 3), v_all.transpose(0, 2, 1, 3), mask,
                                  cfg.attention, offset=offset, scale=scale)
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
                          sinks), kv
        rings = [jax.lax.dynamic_index_in_dim(x, layer, axis=0, keepdims=False) for x in kv]  # [B, K, R, Dh]
        slots, keys, values = c + jnp.arange(length, dtype=jnp.int32), new[0], new[1]
        if not (isinstance(cache_index, int) and cache_index == 0):  # the ring's slots before this call too
            slots = jnp.concatenate([held_slots(c - 1, r), slots])
            keys, values = (jnp.concatenate([ring, x], axis=2) for ring, x in zip(rings, new))
        queries = c + queries_from + jnp.arange(length - queries_from, dtype=jnp.int32)
        out = attend_sequence(q, keys.transpose(0, 2, 1, 3), values.transpose(0, 2, 1, 3),
                              key_mask(mask[:, queries_from:], slots, queries, window), cfg.attention,
                              scale=cfg.query_scale, windowed=True, sinks=sinks)
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
        self.mlp = MoE(config, rngs=rngs) if config.num_experts else MLP(config, rngs=rngs)
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


class LayerSettings:
    """What differs between layers: the rotary table each reads (rl_models.rope.layer_tables) and
    its window (`layer_windows`). `at(i)` gives layer i's (rope, window): with a static i, the
    table itself and the window as an int (None when not windowed); with a traced i (the layer
    scan), an index into the stacked tables and the windows, each only when the layers differ."""

    def __init__(self, config: TransformerConfig, ropes: dict[str, tuple[jax.Array, jax.Array]]):
        self.ropes = ropes
        self.tables = layer_tables(config)
        self.windows = layer_windows(config)
        kinds = list(ropes)
        # stacked once per forward pass (a scanned layer picks its own by index); unused: dead code to XLA
        self.stacked = tuple(jnp.stack([ropes[k][j] for k in kinds]) for j in (0, 1)) if len(kinds) > 1 else None
        self.index = jnp.asarray([kinds.index(t) for t in self.tables], jnp.int32)

    def at(self, i: int | jax.Array) -> tuple[tuple[jax.Array, jax.Array], int | jax.Array | None]:
        if isinstance(i, int):
            window = self.windows[i]
            return self.ropes[self.tables[i]], None if window == FULL_WINDOW else window
        if self.stacked is None:
            rope = next(iter(self.ropes.values()))
        else:
            rope = tuple(jax.lax.dynamic_index_in_dim(table, self.index[i], 0, False) for table in self.stacked)
        distinct = set(self.windows)
        if distinct == {FULL_WINDOW}:
            return rope, None
        if len(distinct) == 1:
            return rope, self.windows[0]
        return rope, jnp.asarray(self.windows, jnp.int32)[i]


def embed_tokens(model: Transformer, tokens: jax.Array) -> jax.Array:
    """Token embeddings [B, L, D] in the compute dtype (times sqrt(D) in the parameters' dtype
    with `embed_scale`, as Gemma's scaled embedding): the rows gathered first, then cast, so no
    compute-dtype copy of the whole table is made."""
    rows = jnp.take(model.embed[...], tokens, axis=0)
    if model.config.embed_scale:
        rows = rows * jnp.asarray(math.sqrt(model.config.hidden_size), rows.dtype)
    return rows.astype(compute_dtype(model.config))


def _vocab_rows(logits: jax.Array) -> jax.Array:
    """Logit chunks [B, C, V] split like the rows (and the vocab over tensor)."""
    return constrain(logits, ("act_batch", "act_length", "act_vocab")) if logits.ndim == 3 else logits


class Transformer(nnx.Module):
    """Decoder-only language model implementing `rl_core.policy.protocols.Policy`.

    `rngs` is used only to initialize parameters; nothing random is kept.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        if config.hybrid:
            raise ValueError("a config with linear-attention layers is a rl_models.HybridTransformer "
                             "(rl_models.model_class(config) picks the class)")
        dtypes = {"dtype": compute_dtype(config), "param_dtype": param_dtype(config)}
        self.config = config
        embed_init = nnx.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)
        self.embed = param(
            embed_init(rngs.params(), (config.vocab_size, config.hidden_size), dtypes["param_dtype"]),
            ("vocab", "embed"),
        )
        # Built one by one (the same random draws as unstacked blocks), then stacked.
        self.layers = stack_layers([Block(config, rngs=rngs) for _ in range(config.num_layers)])
        self.final_norm = norm(config)
        self.lm_head = None if config.tie_embeddings else Linear(
            config.hidden_size, config.vocab_size, axes=("embed", "vocab"), use_bias=False, **dtypes,
            rngs=rngs,
        )

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def init_cache(self, batch_size: int, max_len: int) -> KVCache:
        """Zeroed (k, v) in the compute dtype: each [layers, batch_size, K, max_len, Dh] when the
        layers are scanned, else a tuple of one [batch_size, K, max_len, Dh] per layer."""
        cfg = self.config
        shape = (batch_size, cfg.num_kv_heads, max_len, cfg.head_dim)
        dtype = compute_dtype(cfg)
        if scans_layers(cfg):
            return jnp.zeros((cfg.num_layers, *shape), dtype), jnp.zeros((cfg.num_layers, *shape), dtype)
        return tuple(tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)) for _ in "kv")

    def cache_axes(self) -> KVCacheAxes:
        """Logical axis names of (k, v), shaped like `init_cache`'s: split over rows and KV
        heads, never over slots."""
        if scans_layers(self.config):
            names = PartitionSpec("layers", "batch", "kv_heads", "cache_slots", "head_dim")
            return names, names
        per_layer = (PartitionSpec("batch", "kv_heads", "cache_slots", "head_dim"),) * self.config.num_layers
        return per_layer, per_layer

    def init_decode_cache(self, batch_size: int, max_len: int) -> KVCache | RingKV:
        """`init_cache` for a caller that writes each slot once, in order from slot 0 (a decode
        loop: the static sampler): each windowed layer keeps a ring of its window's slots, min(W,
        max_len), instead of max_len (rl_models.rings). Unrolled, one buffer per layer as
        `init_cache`'s; scanned, a `RingKV`. A model without windowed layers gets `init_cache`'s."""
        cfg = self.config
        windows = layer_windows(cfg)
        if set(windows) == {FULL_WINDOW}:
            return self.init_cache(batch_size, max_len)
        dtype = compute_dtype(cfg)

        def zeros(*lead: int, slots: int) -> jax.Array:
            return jnp.zeros((*lead, batch_size, cfg.num_kv_heads, slots, cfg.head_dim), dtype)

        sizes = [max_len if w == FULL_WINDOW else ring_size(w, max_len) for w in windows]
        if not scans_layers(cfg):
            return tuple(tuple(zeros(slots=n) for n in sizes) for _ in "kv")  # type: ignore[return-value]
        windowed = sum(w != FULL_WINDOW for w in windows)
        ring = ring_size(min(windows), max_len)
        full = None if windowed == cfg.num_layers else tuple(zeros(cfg.num_layers - windowed, slots=max_len)
                                                              for _ in "kv")
        return RingKV(full, (zeros(windowed, slots=ring), zeros(windowed, slots=ring)))  # type: ignore[arg-type]

    def decode_cache_axes(self) -> KVCacheAxes | RingKV:
        """Logical axis names of `init_decode_cache`'s cache (any length), split like `cache_axes`'."""
        if not scans_layers(self.config) or set(layer_windows(self.config)) == {FULL_WINDOW}:
            return self.cache_axes()
        names = PartitionSpec("layers", "batch", "kv_heads", "cache_slots", "head_dim")
        return RingKV(None if all(self.config.windowed()) else (names, names), (names, names))

    def __call__(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                 cache: KVCache | None = None, cache_index: jax.Array | int = 0, *,
                 outputs_from: int = 0, replay: jax.Array | None = None) -> tuple[jax.Array, KVCache | None]:
        """Hidden states [B, L - outputs_from, D] of positions `outputs_from`.. (after the
        final norm) and the updated cache. With the layers unrolled, the last block
        computes its query side (attention output and MLP) only for those positions:
        no later block reads the others. `replay`: see `routed`."""
        hidden, cache, _ = self.routed(tokens, positions, attention_mask, cache, cache_index, outputs_from=outputs_from,
                                       replay=replay)
        return hidden, cache

    def routed(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array,
               cache: KVCache | None = None, cache_index: jax.Array | int = 0, *, outputs_from: int = 0,
               replay: jax.Array | None = None) -> tuple[jax.Array, KVCache | None, Routing | None]:
        """`__call__`, and the routing of a mixture-of-experts model (rl_models.moe.Routing, each
        field [layers, B, L - outputs_from, ...]; None for a dense model). `replay` [layers, B, L, k]
        int32 (every position of the call) makes each layer use those experts instead of its
        router's choice (routing replay); a position whose entry is -1 routes freely (a prompt's
        positions, which the engines do not record); a dense model refuses it."""
        b, l = tokens.shape
        if not 0 <= outputs_from < l:
            raise ValueError(f"outputs_from={outputs_from}: the call has {l} positions")
        s = l if cache is None else self._cache_slots(cache, attention_mask.shape[-1])
        if positions.shape != (b, l) or attention_mask.shape != (b, l, s):
            raise ValueError(
                f"tokens {tokens.shape} need positions of shape {(b, l)} (got "
                f"{positions.shape}) and attention_mask of shape {(b, l, s)} (got "
                f"{attention_mask.shape}); S is {'L' if cache is None else 'the cache length'}"
            )
        if isinstance(cache_index, int) and not 0 <= cache_index <= s - l:
            raise ValueError(f"cache_index={cache_index}: {l} tokens do not fit {s} cache slots")
        if replay is not None:
            want = (self.config.num_layers, b, l, self.config.experts_per_token)
            if not self.config.num_experts or replay.shape != want:
                raise ValueError(f"replay of shape {replay.shape}: the model needs {want} chosen experts"
                                 if self.config.num_experts else "replay: the model has no experts to replay")
        x = constrain(embed_tokens(self, tokens), ROWS)
        x, cache, routing = self._run_layers(x, rope_tables(self.config, positions), attention_mask, cache,
                                             cache_index, outputs_from, replay)
        return self.final_norm(x), cache, routing

    def _cache_slots(self, cache: KVCache | RingKV, mask_slots: int) -> int:
        """The slots S a call's mask must cover: its global layers' cache length, or with every
        layer windowed the mask's when each layer's cache is a ring of min(W, S) slots
        (`init_decode_cache`); ValueError for a cache of the wrong layers."""
        windows = layer_windows(self.config)
        if isinstance(cache, RingKV):
            rows = (0 if cache.full is None else cache.full[0].shape[0], cache.ring[0].shape[0])
            want = (windows.count(FULL_WINDOW), len(windows) - windows.count(FULL_WINDOW))
            if rows != want:
                raise ValueError(f"cache has {rows[0]} global and {rows[1]} windowed layers, the model {want[0]} "
                                 f"and {want[1]}")
            slots = [cache.ring[0].shape[3] if w != FULL_WINDOW else cache.full[0].shape[3]  # type: ignore[index]
                     for w in windows]
        elif isinstance(cache[0], tuple):
            slots = [c.shape[2] for c in cache[0]]
        else:
            slots = [cache[0].shape[3]] * cache[0].shape[0]
        if len(slots) != len(windows):
            raise ValueError(f"cache has {len(slots)} layers, the model {len(windows)}")
        full = [n for n, w in zip(slots, windows) if w == FULL_WINDOW]
        if full:
            s = max(full)
        else:
            s = mask_slots if all(n == ring_size(w, mask_slots) for n, w in zip(slots, windows)) else max(slots)
        for i, (n, w) in enumerate(zip(slots, windows)):
            if n != s and (w == FULL_WINDOW or n != ring_size(w, s)):
                raise ValueError(f"cache layer {i} holds {n} slots: a layer's cache holds the sequence's {s}, or "
                                 f"a windowed layer's its ring of min(window, {s}) = {ring_size(w, s)} "
                                 "(Transformer.init_decode_cache)")
        return s

    def _run_layers(self, x: jax.Array, ropes: dict[str, tuple[jax.Array, jax.Array]], mask: jax.Array,
                    cache: KVCache | None, cache_index: jax.Array | int, outputs_from: int,
                    replay: jax.Array | None = None) -> tuple[jax.Array, KVCache | None, Routing | None]:
        """Every block, as one `lax.scan` over the stacked layer parameters; the
        cache rides in the carry so each layer updates its slice in place. Each layer reads its
        rotary table and window (`LayerSettings`): static when the layer index is, else by index.
        Each layer's routing (experts only) is stacked on a leading layer axis, at the output
        positions; `replay` [layers, B, L, k] feeds each layer its own slice.

        Unrolled, the last block runs after the scan, its queries from `outputs_from` on.
        Scanned, every block keeps the same shape and the output is sliced: taking the last
        layer's slice out of the stacks would copy the other layers' (on TPU, whole FSDP shards).
        """
        graphdef, stacked = nnx.split(self.layers)
        n = self.config.num_layers
        scanned = scans_layers(self.config)
        settings = LayerSettings(self.config, ropes)
        if isinstance(cache, RingKV):  # scanned over the repeating group of layer kinds (rl_models.rings)
            windows = settings.windows

            def ring_layer(x, kv, i, windowed, row, replay_i):
                state = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, 0, False), stacked)
                window = min(windows) if windowed else None  # every windowed layer's is sliding_window
                return nnx.merge(graphdef, state)(x, settings.at(i)[0], mask, kv, cache_index, row, 0, window,
                                                  replay_i)

            x, cache, routing = scan_ring_layers(ring_layer, x, cache, tuple(w != FULL_WINDOW for w in windows),
                                                 replay)
            return x[:, outputs_from:], cache, jax.tree.map(lambda a: a[:, :, outputs_from:], routing)

        def make_layer(queries_from: int, static: int | None = None):
            def layer(x, cache, state, i, replay, slot=None):
                # i: the layer (its settings, unless static); slot: its row in `cache` (default i)
                rope, window = settings.at(i if static is None else static)
                if replay is not None:
                    replay = replay[:, queries_from:]
                return nnx.merge(graphdef, state)(x, rope, mask, cache, cache_index, i if slot is None else slot,
                                                  queries_from, window, replay)

            if self.config.remat != "none":  # keep what the policy saves; recompute the rest in the backward pass
                layer = jax.checkpoint(layer, prevent_cse=False, policy=remat_policy(self.config.remat))
            return layer

        layer = make_layer(0)
        own_slice = cache is not None and self.config.remat != "none"

        def body(carry, xs):
            if not own_slice:
                x, cache, routing = layer(*carry, *xs)
                return (x, cache), routing
            # a rematerialised layer saves its inputs for the backward pass: given the whole stacked
            # cache, every layer would save all of it (layers^2 cache slices; the shared-prompt scoring
            # pass of a 28-layer model, 27 GiB). It gets its own slice; the slice goes back outside.
            (x, cache), (state, i, replay) = carry, xs
            own = jax.tree.map(lambda c: jax.lax.dynamic_slice_in_dim(c, i, 1, axis=0), cache)
            x, own, routing = layer(x, own, state, i, replay, jnp.int32(0))
            cache = jax.tree.map(lambda c, o: jax.lax.dynamic_update_slice_in_dim(c, o, i, axis=0), cache, own)
            return (x, cache), routing

        def at_outputs(routing: Routing | None) -> Routing | None:  # [layers, B, L, ...] -> positions outputs_from..
            return jax.tree.map(lambda a: a[:, :, outputs_from:], routing)

        if cache is not None and isinstance(cache[0], tuple):  # one buffer per layer: unrolled
            ks, vs, routings = [], [], []
            for i in range(n):
                state = jax.tree.map(lambda a, i=i: a[i], stacked)
                kv = (cache[0][i][None], cache[1][i][None])  # a leading layer axis of 1: a bitcast
                queries_from = outputs_from if i == n - 1 else 0
                replay_i = None if replay is None else replay[i]
                x, kv, routing = make_layer(queries_from, static=i)(x, kv, state, jnp.int32(0), replay_i)
                ks.append(kv[0][0])
                vs.append(kv[1][0])
                routings.append(jax.tree.map(lambda a, q=queries_from: a[:, outputs_from - q:], routing))
            return x, (tuple(ks), tuple(vs)), jax.tree.map(lambda *a: jnp.stack(a), *routings)
        layers = jnp.arange(n, dtype=jnp.int32)
        if scanned or outputs_from == 0:
            # unrolled: the same body once per layer, each reading its own slice of the stacks
            (x, cache), routing = jax.lax.scan(body, (x, cache), (stacked, layers, replay),
                                               unroll=1 if scanned else n)
            return x[:, outputs_from:], cache, at_outputs(routing)
        head = jax.tree.map(lambda a: a[:-1], (stacked, layers, replay))
        (x, cache), routing = jax.lax.scan(body, (x, cache), head, unroll=max(n - 1, 1))
        last = jax.tree.map(lambda a: a[-1], (stacked, layers, replay))
        x, cache, last_routing = make_layer(outputs_from)(x, cache, *last)
        routing = jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), at_outputs(routing), last_routing)
        return x, cache, routing

    def loop_view(self) -> Callable[[], Transformer]:
        """For a loop that runs the model at every iteration (a decode loop; see
        rl_core.policy.protocols.loop_policy): takes each layer's parameters out of the stacks
        once, here, outside the loop, and returns what the loop's body calls to get this model
        with its stacks rebuilt from those slices. With the layers unrolled (CPU), the body's
        slice of layer i out of a rebuilt stack folds to the slice itself (XLA simplifies a
        slice of a concatenation), so an iteration reads each layer's weights where they are
        instead of copying them out of the stacks at every token (SmolLM2-135M, 16 rows on CPU:
        98 of a decode step's 430 thread-ms; docs/results/2026-12-03-real-model-floors.md). Scanned
        (accelerators), the model itself: the scan reads its slices in place."""
        if scans_layers(self.config):
            return lambda: self
        n = self.config.num_layers
        model_def, model_state = nnx.split(self)
        layers_def, layers_state = nnx.split(self.layers)
        leaves, treedef = jax.tree.flatten(layers_state)
        # the barrier keeps XLA from folding the slices back into the stacks they came from
        pieces = jax.lax.optimization_barrier([[a[i] for i in range(n)] for a in leaves])

        def rebuild() -> Transformer:
            model = nnx.merge(model_def, model_state)
            model.layers = nnx.merge(layers_def, treedef.unflatten([jnp.stack(p) for p in pieces]))
            return model

        return rebuild

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits [..., V] from hidden states [..., D]."""
        return self.unembedding()(hidden)

    def unembedding(self) -> Callable[[jax.Array], jax.Array]:
        """`logits` with the weight made ready once (cast to the compute dtype and, under a
        mesh, gathered over fsdp), for callers that unembed many chunks (rl_core.policy.logprobs):
        FSDP then gathers the [V, D] table once per pass, not once per chunk."""
        dtype = compute_dtype(self.config)
        head = self.lm_head
        if head is not None and (head.lora_a is not None or head.kernel_scale is not None):
            # adapted or quantized unembedding: the Linear's own path, per call
            return lambda hidden: _vocab_rows(head(hidden.astype(dtype)).astype(jnp.float32))
        if head is None:  # tied: the embedding table [V, D]
            w, names, spec = self.embed[...].astype(dtype), ("act_vocab", "act_embed"), "vd"
        else:
            w, names, spec = head.kernel[...].astype(dtype), ("act_embed", "act_vocab"), "dv"
        r = shards("act_batch")
        if r == 1:  # no mesh splits the rows
            return lambda hidden: jnp.einsum(f"...d,{spec}->...v", hidden.astype(dtype), w,
                                             preferred_element_type=jnp.float32)
        # one gathered copy per row shard, [R, ...] split over R (each device holds its own):
        # the backward pass sums each shard's weight gradient over every chunk locally and
        # reduces it once (the broadcast's transpose), where one shared copy would make XLA
        # all-reduce every chunk's partial gradient inside the chunk loop
        per_shard = constrain(jnp.broadcast_to(w, (r, *w.shape)), ("act_batch", *names))

        def unembed(hidden: jax.Array) -> jax.Array:
            h = hidden.astype(dtype)
            if h.ndim != 3 or h.shape[0] % r:
                return jnp.einsum(f"...d,{spec}->...v", h, w, preferred_element_type=jnp.float32)
            b, c, d = h.shape
            h = constrain(h.reshape(r, b // r, c, d), ("act_batch", None, None, None))
            out = jnp.einsum(f"rbcd,r{spec}->rbcv", h, per_shard, preferred_element_type=jnp.float32)
            return _vocab_rows(out.reshape(b, c, -1))

        return unembed
