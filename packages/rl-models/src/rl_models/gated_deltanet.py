"""Gated DeltaNet linear attention (Yang et al. 2024, arXiv:2412.06464), as Qwen3.5 and
Qwen3-Next run it in transformers.

Shapes: B batch, L tokens, C = 2 * Hk * Dk + Hv * Dv convolved channels (q, k, v),
Hk query/key heads of width Dk, Hv value heads of width Dv (each key head serves
Hv / Hk consecutive value heads), K convolution taps.

Per token t of a sequence, with S the [Dk, Dv] state of a value head:

    q, k, v = silu(causal depthwise conv(in_proj_qkv(x)))   (q, k L2-normalised, q / sqrt(Dk))
    beta = sigmoid(in_proj_b(x));  g = -exp(A_log) * softplus(in_proj_a(x) + dt_bias)
    S = exp(g) S;  S = S + k (beta (v - S^T k))^T;  o = S^T q
    out = out_proj(rmsnorm(o) * w * silu(in_proj_z(x)))

Training and prefill run the chunked form (`chunked_delta_rule`: within a chunk, matmuls only;
across chunks, `lax.scan`); decoding runs the recurrence
(`recurrent_delta_rule`) from a fixed-size state per sequence: the last K - 1 inputs of
the convolution and S. A `reset` flag starts a token's sequence afresh (nothing before it
reaches it, through the convolution or the state): how left padding and packed rows keep
their sequences apart. Inputs of invalid (padding) tokens are zeroed first, as transformers
does, so they write nothing into the state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rl_models.config import TransformerConfig
from rl_models.layers import Linear, param

State = tuple[jax.Array, jax.Array]
"""(conv [B, K - 1, C] in the compute dtype, recurrent [B, Hv, Dk, Dv] float32): one layer's."""


def segment_ids(reset: jax.Array) -> jax.Array:
    """[B, L] int32: how many resets happened at or before each token (0: the sequence that was
    running before this call)."""
    return jnp.cumsum(reset.astype(jnp.int32), axis=1)


def causal_conv(x: jax.Array, weight: jax.Array, conv_state: jax.Array, reset: jax.Array,
                lengths: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(silu(causal depthwise convolution) [B, L, C], the new conv state [B, K - 1, C]).

    x [B, L, C]; weight [K, C] (tap j multiplies the input K - 1 - j tokens back); conv_state
    [B, K - 1, C], the inputs before this call. A tap reaching across a reset (or into the
    state, once a reset happened) reads zero, as a sequence starting there would. `lengths` [B]:
    only each row's first `lengths` tokens continue its sequence (the rest is padding), so the
    new state holds the K - 1 inputs before its token `lengths` (a row of length 0 keeps its state).
    """
    taps = weight.shape[0]
    b, length, _ = x.shape
    ext = jnp.concatenate([conv_state.astype(x.dtype), x], axis=1)  # [B, K - 1 + L, C]
    seg = segment_ids(reset)
    ext_seg = jnp.concatenate([jnp.zeros((b, taps - 1), jnp.int32), seg], axis=1)
    out = jnp.zeros(x.shape, jnp.float32)
    for j in range(taps):
        src = jax.lax.dynamic_slice_in_dim(ext, j, length, axis=1)
        same = jax.lax.dynamic_slice_in_dim(ext_seg, j, length, axis=1) == seg
        out = out + jnp.where(same[..., None], src.astype(jnp.float32) * weight[j].astype(jnp.float32), 0.0)
    if lengths is None:
        last = seg[:, -1:]
        new_state, new_seg = ext[:, ext.shape[1] - (taps - 1):], ext_seg[:, ext_seg.shape[1] - (taps - 1):]
    else:  # the window ending before each row's token `lengths` (ext index j is input j - (K - 1))
        window = lengths[:, None] + jnp.arange(taps - 1)[None, :]  # [B, K - 1]
        new_state = jnp.take_along_axis(ext, window[..., None], axis=1)
        new_seg = jnp.take_along_axis(ext_seg, window, axis=1)
        # the segment of its last valid token (of the state's last input when it has none)
        last = jnp.take_along_axis(ext_seg, jnp.maximum(lengths + taps - 2, 0)[:, None], axis=1)
    if taps > 1:
        new_state = jnp.where((new_seg == last)[..., None], new_state, 0)
    return jax.nn.silu(out).astype(x.dtype), new_state.astype(conv_state.dtype)


def l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(sum(x^2) + eps) over the last axis (float32), as transformers and FLA compute it."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def _prepare(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array):
    """Float32 [B, Hv, L, ...] operands: q and k repeated to the value heads, L2-normalised,
    q scaled by Dk^-1/2."""
    groups = v.shape[2] // q.shape[2]
    q, k = (jnp.repeat(x, groups, axis=2) if groups > 1 else x for x in (q, k))
    q, k = l2norm(q.astype(jnp.float32)), l2norm(k.astype(jnp.float32))
    q = q * q.shape[-1] ** -0.5
    q, k, v = (x.astype(jnp.float32).transpose(0, 2, 1, 3) for x in (q, k, v))
    g, beta = (x.astype(jnp.float32).transpose(0, 2, 1) for x in (g, beta))
    return q, k, v, g, beta


def recurrent_delta_rule(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
                         state: jax.Array, reset: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(o [B, L, Hv, Dv] float32, final state [B, Hv, Dk, Dv]) one token at a time.

    q, k [B, L, Hk, Dk]; v [B, L, Hv, Dv]; g (log decay, <= 0) and beta [B, L, Hv]; state
    [B, Hv, Dk, Dv]; reset [B, L] (the state is zero before such a token)."""
    q, k, v, g, beta = _prepare(q, k, v, g, beta)

    def step(s, xs):
        q_t, k_t, v_t, g_t, b_t, r_t = xs  # [B, Hv, Dk] ..., [B, Hv], [B]
        s = s * (jnp.exp(g_t) * (1.0 - r_t[:, None]))[..., None, None]
        kv_mem = jnp.einsum("bhkv,bhk->bhv", s, k_t)
        delta = (v_t - kv_mem) * b_t[..., None]
        s = s + k_t[..., :, None] * delta[..., None, :]
        return s, jnp.einsum("bhkv,bhk->bhv", s, q_t)

    xs = (q.transpose(2, 0, 1, 3), k.transpose(2, 0, 1, 3), v.transpose(2, 0, 1, 3), g.transpose(2, 0, 1),
          beta.transpose(2, 0, 1), reset.astype(jnp.float32).T)
    state, out = jax.lax.scan(step, state.astype(jnp.float32), xs)
    return out.transpose(1, 0, 2, 3), state  # [L, B, Hv, Dv] -> [B, L, Hv, Dv]


def unit_lower_inverse(strict: jax.Array) -> jax.Array:
    """(I + A)^-1 for strictly lower triangular A [..., C, C]: A is nilpotent (A^C = 0), so
    (I + A)^-1 = (I - A)(I + A^2)(I + A^4)... over ceil(log2 C) factors, matmuls only (the UT
    transform of the chunked delta rule). Not `lax.linalg.triangular_solve`: on XLA:CPU a training
    step holding it (its LAPACK custom call, in the backward pass too) never finished in the
    trainer's update program, and accelerators run it one row at a time."""
    eye = jnp.eye(strict.shape[-1], dtype=strict.dtype)
    power = -strict
    inverse = eye + power
    for _ in range(max(strict.shape[-1] - 1, 1).bit_length() - 1):
        power = power @ power
        inverse = inverse @ (eye + power)
    return inverse


def chunked_delta_rule(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
                       state: jax.Array, reset: jax.Array, chunk: int) -> tuple[jax.Array, jax.Array]:
    """`recurrent_delta_rule`'s values, by chunks of `chunk` tokens (transformers'
    torch_chunk_gated_delta_rule, with resets): within a chunk, the delta rule's updates are
    one unit-lower-triangular inverse (the UT transform) and matmuls restricted to pairs of
    tokens of one sequence; the state crosses chunks in a `lax.scan`, read only by the tokens
    before the chunk's first reset and carried on only when the chunk has none."""
    b, length = reset.shape
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    pad = -length % chunk
    if pad:
        q, k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (q, k, v))
        g, beta = (jnp.pad(x, ((0, 0), (0, 0), (0, pad))) for x in (g, beta))
        reset = jnp.pad(reset, ((0, 0), (0, pad)))
    n = (length + pad) // chunk
    h = v.shape[1]

    def chunks(x: jax.Array) -> jax.Array:  # [B, Hv, N * C, ...] -> [N, B, Hv, C, ...]
        return jnp.moveaxis(x.reshape(b, h, n, chunk, *x.shape[3:]), 2, 0)

    q, k, v, g, beta = map(chunks, (q, k, v, g, beta))
    seg = jnp.moveaxis(segment_ids(reset.reshape(b * n, chunk)).reshape(b, n, chunk), 1, 0)[:, :, None]  # [N, B, 1, C]
    carried = (seg == 0).astype(jnp.float32)  # tokens still in the sequence of the incoming state
    cum = jnp.cumsum(g, axis=-1)  # [N, B, Hv, C]
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))
    pairs = lower & (seg[..., :, None] == seg[..., None, :])  # [N, B, 1, C, C]: j <= i, one sequence
    decay = jnp.exp(jnp.where(pairs, cum[..., :, None] - cum[..., None, :], -jnp.inf))
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    strict = jnp.einsum("...id,...jd->...ij", k_beta, k) * decay * (1.0 - jnp.eye(chunk))
    rhs = jnp.concatenate([v_beta, k_beta * (jnp.exp(cum) * carried)[..., None]], axis=-1)
    solved = unit_lower_inverse(strict) @ rhs
    dv = v.shape[-1]
    new_values, k_cumdecay = solved[..., :dv], solved[..., dv:]
    intra = jnp.einsum("...id,...jd->...ij", q, k) * decay
    q_in = q * (jnp.exp(cum) * carried)[..., None]
    last = seg[..., -1:]  # the sequence the chunk ends in
    k_out = k * (jnp.exp(cum[..., -1:] - cum) * (seg == last))[..., None]
    chunk_decay = jnp.exp(cum[..., -1]) * carried[..., -1]  # [N, B, Hv]

    def step(s, xs):
        nv, kc, qi, it, ko, cd = xs
        v_new = nv - jnp.einsum("bhck,bhkv->bhcv", kc, s)
        out = jnp.einsum("bhck,bhkv->bhcv", qi, s) + jnp.einsum("bhij,bhjv->bhiv", it, v_new)
        s = s * cd[..., None, None] + jnp.einsum("bhck,bhcv->bhkv", ko, v_new)
        return s, out

    state, out = jax.lax.scan(step, state.astype(jnp.float32), (new_values, k_cumdecay, q_in, intra, k_out, chunk_decay))
    out = jnp.moveaxis(out, 0, 2).reshape(b, h, n * chunk, dv)[:, :, :length]
    return out.transpose(0, 2, 1, 3), state


class GatedDeltaNet(nnx.Module):
    """One linear-attention layer (transformers' Qwen3_5GatedDeltaNet; its parameter names)."""

    def __init__(self, config: TransformerConfig, *, dtype: jnp.dtype, param_dtype: jnp.dtype, rngs: nnx.Rngs):
        la = config.linear_attention
        assert la is not None
        d = config.hidden_size
        self.shape = la
        self.key_dim, self.value_dim = la.num_key_heads * la.key_head_dim, la.num_value_heads * la.value_head_dim
        conv_dim = 2 * self.key_dim + self.value_dim
        lin = {"use_bias": False, "dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        # outputs whole on every device: q, k and v share one convolution over their concatenation
        self.in_proj_qkv = Linear(d, conv_dim, axes=("embed", None), **lin)
        self.in_proj_z = Linear(d, self.value_dim, axes=("embed", None), **lin)
        self.in_proj_b = Linear(d, la.num_value_heads, axes=("embed", None), **lin)
        self.in_proj_a = Linear(d, la.num_value_heads, axes=("embed", None), **lin)
        self.out_proj = Linear(self.value_dim, d, axes=(None, "embed"), **lin)
        bound = la.conv_kernel_size ** -0.5
        # [C, 1, K] as transformers' depthwise Conv1d stores it
        self.conv_weight = param(jax.random.uniform(rngs.params(), (conv_dim, 1, la.conv_kernel_size), param_dtype,
                                                    -bound, bound), (None, None, None))
        self.dt_bias = param(jnp.ones((la.num_value_heads,), param_dtype), (None,))
        self.A_log = param(jnp.log(jax.random.uniform(rngs.params(), (la.num_value_heads,), jnp.float32, 1.0, 16.0)
                                   ).astype(param_dtype), (None,))
        self.norm_weight = param(jnp.ones((la.value_head_dim,), param_dtype), (None,))
        self.eps = config.rms_norm_eps
        self.dtype = dtype

    def init_state(self, batch_size: int) -> State:
        la = self.shape
        return (jnp.zeros((batch_size, la.conv_kernel_size - 1, 2 * self.key_dim + self.value_dim), self.dtype),
                jnp.zeros((batch_size, la.num_value_heads, la.key_head_dim, la.value_head_dim), jnp.float32))

    def __call__(self, x: jax.Array, valid: jax.Array, reset: jax.Array, state: State | None, *,
                 hold: bool = False) -> tuple[jax.Array, State]:
        """(out [B, L, D], the state after the last token). x [B, L, D] (normed); valid and
        reset [B, L]; `state` None starts every row afresh. `hold` (the paged engine's rows, whose
        valid tokens come first): invalid tokens leave the state as it was (no decay, no write),
        so the state is the one after each row's last valid token."""
        la = self.shape
        b, length, _ = x.shape
        conv_state, rec = self.init_state(b) if state is None else state
        x = jnp.where(valid[..., None], x, 0).astype(x.dtype)
        lengths = None
        if hold:
            reset = reset & valid
            lengths = jnp.sum(valid, axis=1, dtype=jnp.int32)
        qkv, conv_state = causal_conv(self.in_proj_qkv(x), self.conv_weight[...][:, 0].T, conv_state, reset,
                                      lengths)
        q = qkv[..., : self.key_dim].reshape(b, length, la.num_key_heads, la.key_head_dim)
        k = qkv[..., self.key_dim : 2 * self.key_dim].reshape(b, length, la.num_key_heads, la.key_head_dim)
        v = qkv[..., 2 * self.key_dim :].reshape(b, length, la.num_value_heads, la.value_head_dim)
        beta = jax.nn.sigmoid(self.in_proj_b(x).astype(jnp.float32))
        a = self.in_proj_a(x).astype(jnp.float32)
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a + self.dt_bias[...].astype(jnp.float32))
        if hold:  # a decay of 1 and no write: the state passes an invalid token unchanged
            g, beta = jnp.where(valid[..., None], g, 0.0), jnp.where(valid[..., None], beta, 0.0)
        if length == 1:
            o, rec = recurrent_delta_rule(q, k, v, g, beta, rec, reset)
        else:
            o, rec = chunked_delta_rule(q, k, v, g, beta, rec, reset, la.chunk_tokens)
        # gated RMSNorm per value head: norm in float32, scale, times silu(z)
        z = self.in_proj_z(x).reshape(b, length, la.num_value_heads, la.value_head_dim).astype(jnp.float32)
        normed = o * jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + self.eps)
        normed = self.norm_weight[...].astype(self.dtype) * normed.astype(self.dtype)
        gated = (normed.astype(jnp.float32) * jax.nn.silu(z)).astype(self.dtype)
        return self.out_proj(gated.reshape(b, length, self.value_dim)), (conv_state, rec)
