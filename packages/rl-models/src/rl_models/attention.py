"""Attention over whole sequences (training, log-probs, prefill): which kernel runs, and the kernels.

`TransformerConfig.attention` names it:

  xla     batched matmuls over (row, KV head) with a float32 softmax (`attend`);
          runs everywhere.
  cudnn   cuDNN's fused flash attention through `jax.nn.dot_product_attention` (NVIDIA GPUs, bfloat16).
  splash  the Splash kernel of `jax.experimental.pallas.ops.tpu.splash_attention` (TPU).
  auto    cudnn on a GPU when the dtype and head size allow it, splash on TPU for sequences of
          `SPLASH_MIN_LENGTH` queries or more, xla elsewhere.

`resolve` picks, when a program is traced, for the platform it is traced for; on CPU `auto` is
xla, so CPU programs are those of `attention: xla`, number for number.

Masks. The model takes a boolean mask [B, L, S] (query i may see key slot j), and its callers
pass causal attention within segments: query i sits at slot offset + i and sees the earlier slots
of its own sequence (rl_core.policy.logprobs and the sampler's prefill: one sequence after its padding;
rl_core.train.packing: several per row). xla and cudnn take the mask as given. Splash computes the
causal part in blocks and takes the rest as segment ids (`segment_ids`): a query's segment is the
first slot it may see, a slot's that of the query at it, and padding (a query that may see
nothing) is segment -1. Real queries then see exactly the mask's keys; a padding query sees the
padding before it instead of nothing (its output is never read). Splash works in blocks:
sequences are padded to whole blocks, in segment -1.

Planning. Under `traced_for(platform)` a program is traced as it would be for `platform`
(`auto` resolves for it), and a fused kernel that cannot run on this host (cuDNN or Splash on a
CPU) is traced as a stand-in with the kernel's memory: the same inputs, output and saved
residuals (output and log-sum-exp, float32 dq accumulator in the backward pass), none of its
arithmetic. `trainer plan` compiles its programs so. Under `traced_for(platform, kernels=True)` the
real kernels are traced instead, for a program lowered for `platform` on this host
(`.lower(lowering_platforms=(platform,))`: the tests that check every TPU program lowers).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from rl_models.sharding import partition_spec

ATTENTION = ("auto", "xla", "cudnn", "splash")
GPU_PLATFORMS = ("gpu", "cuda")
CUDNN_MAX_HEAD_DIM = 128
"""cuDNN's flash attention takes head sizes that are multiples of 8 up to 128 (256 on Hopper)."""
DECODE_ATTENTION = "lanes"
"""A decode step's attention over the stacked cache of a scanned model (accelerators): "lanes" (heads
narrower than 128 lanes cached side by side, `rl_models.block.LaneKV`, read by `attend_lanes`; other
heads as "masked"), "masked" (`attend` over every slot of the heads' layout [.., K, S, Dh]) or "live"
(the blocks of slots that hold live ones, read in place: rl_models.block.attend_live). "live" moves
half the bytes in XLA:TPU's compiled program, yet on a v5e it ran 7.05 ms a step where "masked" ran
5.59 (0.5B shape, 128 rows, 256 new tokens: docs/results/2026-12-06-decode-hlo.md). "masked" and
"live" are kept to measure: benchmarks/rollout_engines.py --decode-attention lanes masked live."""
SPLASH_MAX_BLOCK = 512
"""Largest Splash block (queries or keys); a block is a multiple of 128 (TPU lanes)."""
SPLASH_MIN_LENGTH = 128
"""`auto` on TPU runs sequences of fewer queries as xla: Splash pads them to a whole block of 128 and
pays its kernels' fixed cost each call. On a v5e, tiny-qwen2's update (15 positions) ran its program
in 3.5 ms with Splash and 0.54 ms with xla (docs/results/2026-12-06-tpu-chip-sixth.md); MaxText's
`autoselected` draws the same line."""

KERNELS = {
    "cudnn": ("cuDNN's flash attention", "NVIDIA GPUs", GPU_PLATFORMS),
    "splash": ("JAX's Splash kernel", "TPU", ("tpu",)),
}
"""Fused kernel -> (what it is, where it runs, the platforms that have it)."""

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("rl_models_attention_target", default=None)
_KERNELS: contextvars.ContextVar[bool] = contextvars.ContextVar("rl_models_attention_kernels", default=False)


@contextlib.contextmanager
def traced_for(platform: str, *, kernels: bool = False) -> Iterator[None]:
    """Trace programs as for `platform` ("gpu", "tpu", "cpu") on this host (see the module doc);
    `kernels`: the platform's real kernels, not stand-ins (for lowering, not for running here)."""
    tokens = _TARGET.set(platform), _KERNELS.set(kernels)
    try:
        yield
    finally:
        _TARGET.reset(tokens[0])
        _KERNELS.reset(tokens[1])


def target_platform() -> str:
    """The platform programs are traced for: `traced_for`'s, else JAX's backend."""
    return _TARGET.get() or jax.default_backend()


def cudnn_problem(dtype: jnp.dtype, head_dim: int) -> str | None:
    """Why cuDNN's flash attention cannot take these inputs (None: it can)."""
    if jnp.dtype(dtype) != jnp.bfloat16:
        return f"it takes bfloat16 compute, not {jnp.dtype(dtype).name}"
    if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
        return f"head_dim {head_dim}: it takes multiples of 8 up to {CUDNN_MAX_HEAD_DIM}"
    return None


def resolve(attention: str, *, dtype: jnp.dtype, head_dim: int, platform: str | None = None,
            length: int | None = None) -> str:
    """The implementation ("xla", "cudnn" or "splash") that `attention` means on `platform`
    (default: `target_platform()`) for sequences of `length` queries (None: long ones);
    ValueError for a fused kernel the platform does not have."""
    where = platform or target_platform()
    if attention == "auto":
        if where in GPU_PLATFORMS:
            return "xla" if cudnn_problem(dtype, head_dim) or _rocm(where) else "cudnn"
        short = length is not None and length < SPLASH_MIN_LENGTH
        return "splash" if where == "tpu" and not short else "xla"
    if attention not in ATTENTION:
        raise ValueError(f"attention={attention!r}: must be one of {ATTENTION}")
    if attention in KERNELS and where not in KERNELS[attention][2]:
        what, runs_on, _ = KERNELS[attention]
        raise ValueError(f"attention={attention!r}: {what} runs on {runs_on}, and this program is traced for "
                         f"{where!r}; use 'auto' (picks by platform) or 'xla'")
    return attention


def traced_kernel(attention: str, *, dtype: jnp.dtype, head_dim: int, length: int | None = None) -> str:
    """`resolve` for the program being traced, except that Splash, one opaque call per device that
    XLA cannot split, runs only on one device or under a mesh layout (it then runs in shard_map);
    a program traced for several devices without one (the static sampler's prefill, the warm
    start) gets xla."""
    kind = resolve(attention, dtype=dtype, head_dim=head_dim, length=length)
    if kind == "splash" and jax.device_count() > 1 and partition_spec(("act_batch",), (1,)) is None:
        return "xla"
    return kind


def _rocm(platform: str) -> bool:
    """Whether `platform` is this host's GPU backend and an AMD one (no cuDNN)."""
    return platform == jax.default_backend() and "rocm" in jax.devices()[0].client.platform_version.lower()


def _stand_in_needed() -> bool:
    return target_platform() != jax.default_backend() and not _KERNELS.get()


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float | None = None,
           sinks: jax.Array | None = None, softcap: float | None = None) -> jax.Array:
    """Grouped-query attention over head-major keys and values (the cache's layout).

    q [B, L, H, Dh], k/v [B, K, S, Dh] (the cache's layout), mask [B, L, S]
    (True = may attend) -> [B, L, H * Dh]. Both matmuls are batched over (B, K)
    with the G query heads of a KV head and their L queries as one [G * L] row
    block, so XLA runs plain batched matmuls instead of transposing the cache.
    Scores and softmax run in float32; masked scores are the most negative
    float32, so a fully masked row gets a finite uniform distribution, not NaN.
    On CPU the gradient is `_attention_core_cpu`'s (the same values). `sinks` [H] (gpt-oss): each
    head's extra logit in every query's softmax, which takes probability but adds no value.
    `softcap`: scores become softcap * tanh(scores / softcap) before the mask (Gemma 2's).
    """
    b, l, h, dh = q.shape
    kv_heads = k.shape[1]
    g = h // kv_heads
    q = q.reshape(b, l, kv_heads, g, dh).transpose(0, 2, 3, 1, 4).reshape(b, kv_heads, g * l, dh)
    mask = jnp.broadcast_to(mask[:, None, None], (b, kv_heads, g, l, mask.shape[-1])).reshape(b, kv_heads, g * l, -1)
    scale = 1.0 / math.sqrt(dh) if scale is None else scale
    if sinks is not None:  # head kv * G + i's sink, for its L query rows
        rows = jnp.repeat(sinks.astype(jnp.float32).reshape(kv_heads, g), l, axis=1)  # [K, G * L]
        out = _attention_with_sinks(q, k, v, mask, scale, rows, softcap)
    elif softcap is not None:  # autodiff's gradient (the CPU one below is written for plain scores)
        out = _attention_core(q, k, v, mask, scale, softcap)
    else:
        core = _attention_core_cpu if target_platform() == "cpu" else _attention_core
        out = core(q, k, v, mask, scale)
    out = out.reshape(b, kv_heads, g, l, dh).transpose(0, 3, 1, 2, 4)
    return out.reshape(b, l, h * dh).astype(v.dtype)


def soft_capped(scores: jax.Array, softcap: float | None) -> jax.Array:
    """softcap * tanh(scores / softcap) (scores as they are with no cap)."""
    return scores if softcap is None else jnp.float32(softcap) * jnp.tanh(scores / jnp.float32(softcap))


def _attention_probs(q: jax.Array, k: jax.Array, mask: jax.Array, scale: float,
                     softcap: float | None = None) -> jax.Array:
    """float32 softmax(q k^T * scale) [B, K, Q, S] over head-major q [B, K, Q, Dh], k [B, K, S, Dh]
    where mask [B, K, Q, S] holds (scores soft-capped first with a `softcap`)."""
    scores = soft_capped(jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32) * scale, softcap)
    return jax.nn.softmax(jnp.where(mask, scores, jnp.finfo(jnp.float32).min), axis=-1)


def _attention_with_sinks(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                          sinks: jax.Array, softcap: float | None = None) -> jax.Array:
    """float32 [B, K, Q, Dh] attention whose softmax over each row also holds the row's sink
    logit `sinks` [K, Q] (then dropped): p_s = exp(x_s - m) / (sum_s' exp(x_s' - m) + exp(sink - m))."""
    scores = soft_capped(jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32) * scale, softcap)
    probs = softmax_with_sinks(jnp.where(mask, scores, jnp.finfo(jnp.float32).min), sinks[None])
    return jnp.einsum("bkqs,bksd->bkqd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)


def softmax_with_sinks(scores: jax.Array, sinks: jax.Array) -> jax.Array:
    """float32 softmax over the last axis of scores [..., Q, S] with each row's sink logit sinks
    [..., Q] (broadcast) in its denominator, then dropped: exp(x_s - m) / (sum exp(x - m) + exp(sink - m))."""
    top = jnp.maximum(jnp.max(scores, axis=-1), sinks)
    e = jnp.exp(scores - top[..., None])
    return e / (jnp.sum(e, axis=-1) + jnp.exp(sinks - top))[..., None]


def _attention_core(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                    softcap: float | None = None) -> jax.Array:
    """float32 [B, K, Q, Dh] attention output of head-major q, k, v (see `_attention_probs`)."""
    return _attention_core_fwd(q, k, v, mask, scale, softcap)[0]  # the residuals are dead code to XLA


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention_core_cpu(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """`_attention_core` with the gradient autodiff gives, computed so that XLA:CPU runs every
    matmul of it through its matmul library. Autodiff's dk = ds^T q and dv = p^T dout contract
    over the query axis, which is not the minor one of either operand; XLA:CPU runs that form as
    its own batched dot, far slower than the library's. Here ds and p are transposed first, behind
    an optimization barrier so that XLA does not fold the transpose back into the dot (tiny-qwen2
    update 5-8% faster)."""
    return _attention_core(q, k, v, mask, scale)


def _attention_core_fwd(q, k, v, mask, scale, softcap=None):
    """(the output, the residuals `_attention_core_bwd` reads; that backward is for softcap None)."""
    probs = _attention_probs(q, k, mask, scale, softcap)
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
                    windowed: bool = False, sinks: jax.Array | None = None,
                    softcap: float | None = None) -> jax.Array:
    """Grouped-query attention over whole sequences (training, prefill): q [B, L, H, Dh] at key
    slots offset..offset+L-1, k/v [B, S, K, Dh], mask [B, L, S] -> [B, L, H * Dh].

    `implementation` is `TransformerConfig.attention`, resolved for the platform the program is
    traced for (`traced_kernel`). "xla": the head-major batched matmuls of
    `attend` (on XLA:CPU 12% faster over a whole tiny-qwen2 update than
    `jax.nn.dot_product_attention`'s XLA path, whose grouped-query reshapes become strided
    copies); "cudnn" and "splash": the fused kernels. `scale` multiplies the scores (None:
    1 / sqrt(Dh)). Splash builds its mask from causal blocks and segments, which cannot say a
    sliding window: a `windowed` layer's attention runs as xla there, as does any with `sinks`.
    `softcap` soft-caps the scores (Splash takes it; cuDNN's does not, so such a layer runs as xla).
    """
    if sinks is not None:  # the fused kernels have no sink logit
        return attend(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask, scale, sinks, softcap)
    kind = traced_kernel(implementation, dtype=q.dtype, head_dim=q.shape[-1], length=q.shape[1])
    if softcap is not None and kind == "cudnn":
        kind = "xla"
    if scale is not None and kind in ("cudnn", "splash"):  # the kernels scale by 1 / sqrt(Dh): the queries carry the rest
        q = (q.astype(jnp.float32) * (scale * math.sqrt(q.shape[-1]))).astype(q.dtype)
    if kind == "cudnn":
        return cudnn(q, k, v, mask)
    if kind == "splash" and not windowed:
        return splash(q, k, v, mask, offset=offset, softcap=softcap)
    return attend(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask, scale, softcap=softcap)


def cudnn(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """cuDNN flash attention: q [B, L, H, Dh], k/v [B, S, K, Dh], mask [B, L, S] -> [B, L, H * Dh].

    cuDNN takes a mask as an additive bias, and with a bias it trains only on even lengths: an
    odd L or S gets one more query and key slot (the new query sees only the new key; no other
    query sees it), cut off again after."""
    b, l, h, dh = q.shape
    k, v = k.astype(q.dtype), v.astype(q.dtype)
    q, k, v, mask = _even_lengths(q, k, v, mask)
    if _stand_in_needed():
        bias = jnp.where(mask[:, None], 0.0, jnp.finfo(q.dtype).min).astype(q.dtype)  # as jax builds it
        out = _stand_in(q, k, v, bias)
    else:
        out = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=1.0 / math.sqrt(dh),
                                           implementation="cudnn")
    return out[:, :l].reshape(b, l, h * dh)


def _even_lengths(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array
                  ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    l, s = q.shape[1], k.shape[1]
    pad_q, pad_s = l % 2, s % 2
    if not (pad_q or pad_s):
        return q, k, v, mask
    q = jnp.pad(q, ((0, 0), (0, pad_q), (0, 0), (0, 0)))
    k, v = (jnp.pad(x, ((0, 0), (0, pad_s), (0, 0), (0, 0))) for x in (k, v))
    mask = jnp.pad(mask, ((0, 0), (0, pad_q), (0, pad_s)))
    if pad_q:  # the new query sees the last key slot (the new one when there is one): never an empty row
        mask = mask.at[:, -1, -1].set(True)
    return q, k, v, mask


def splash(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, offset: int = 0,
           interpret: bool = False, softcap: float | None = None) -> jax.Array:
    """The Splash kernel: q [B, L, H, Dh] at key slots offset..offset+L-1, k/v [B, S, K, Dh],
    mask [B, L, S] (causal within segments, see the module doc) -> [B, L, H * Dh].

    `interpret` runs the kernel in the Pallas interpreter (any platform: tests). Under a mesh and
    logical-axis rules (as `rl_core.runtime.mesh.activation_layout` traces programs) the kernel runs per
    device through `shard_map`, rows split like act_batch and heads like act_kv_heads.
    """
    b, l, h, dh = q.shape
    s = k.shape[1]
    block_q = _splash_block(l)
    lq = _round_up(l, block_q)
    block_kv = _splash_block(max(s, offset + lq))
    ls = _round_up(max(s, offset + lq), block_kv)
    seg_q, seg_kv = segment_ids(mask, offset, ls)
    seg_q = jnp.pad(seg_q, ((0, 0), (0, lq - l)), constant_values=-1)
    # head-major, padded to whole blocks; Splash takes no scale, so the queries carry it
    q = (q.astype(jnp.float32) * (1.0 / math.sqrt(dh))).astype(q.dtype)
    q = jnp.pad(q, ((0, 0), (0, lq - l), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
    k, v = (jnp.pad(x.astype(q.dtype), ((0, 0), (0, ls - s), (0, 0), (0, 0))).transpose(0, 2, 1, 3) for x in (k, v))

    def run(q, k, v, seg_q, seg_kv):
        if _stand_in_needed() and not interpret:
            return _stand_in(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
                             (seg_q, seg_kv)).transpose(0, 2, 1, 3)
        from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds  # noqa: PLC0415

        def kernel(q, k, v, segments):
            # made where it is called: the kernel holds its mask as arrays of the trace that makes it, and
            # a custom_vjp closing over them would leak them into a later trace of a cached remat'd layer
            return jax.vmap(_splash_kernel(q.shape[1], lq, ls, offset, block_q, block_kv, interpret, softcap))(
                q, k, v, segments)

        if q.dtype != jnp.float32:  # Mosaic refuses bfloat16 operands at a float32 contract precision
            kernel = at_default_precision(kernel)
        return kernel(q, k, v, SegmentIds(seg_q, seg_kv))

    heads = partition_spec(("act_batch", "act_kv_heads", None, None), k.shape)
    if heads is not None:  # per device: the kernel is one opaque call that XLA would not split
        rows = partition_spec(("act_batch", None), seg_q.shape)
        run = jax.shard_map(run, in_specs=(heads, heads, heads, rows, rows), out_specs=heads, check_vma=False)
    out = run(q, k, v, seg_q, seg_kv)
    return out.transpose(0, 2, 1, 3)[:, :l].reshape(b, l, h * dh)


def at_default_precision(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with its forward and backward passes traced at the default matmul precision, whatever
    the caller's (`jax.default_matmul_precision`, JAX_DEFAULT_MATMUL_PRECISION): a Pallas TPU
    kernel's products of bfloat16 operands compile only there (Mosaic: "Bad lhs type" at `highest`),
    and are exact there. A `with` around the call alone would miss the backward pass, which is
    traced after the forward has returned."""

    @jax.custom_vjp
    def run(*args):
        with jax.default_matmul_precision("default"):
            return fn(*args)

    def forward(*args):
        with jax.default_matmul_precision("default"):
            return jax.vjp(fn, *args)

    def backward(vjp, cotangent):
        with jax.default_matmul_precision("default"):
            return vjp(cotangent)

    run.defvjp(forward, backward)
    return run


def segment_ids(mask: jax.Array, offset: int, slots: int) -> tuple[jax.Array, jax.Array]:
    """(query segments [B, L], key segments [B, slots]) of a mask [B, L, S] that is causal within
    segments: a query's segment is the first key slot it may see (-1: none, padding), a key's is
    that of the query at its slot; slots before the queries (a cache prefix) are in the last
    query's segment when it sees them, and slots past them (empty cache, block padding) in -1."""
    b, l, s = mask.shape
    seg_q = jnp.where(mask.any(axis=-1), jnp.argmax(mask, axis=-1), -1).astype(jnp.int32)
    prefix = jnp.where(mask[:, -1, :offset], seg_q[:, -1:], -1).astype(jnp.int32)
    return seg_q, jnp.concatenate([prefix, seg_q, jnp.full((b, slots - offset - l), -1, jnp.int32)], axis=1)


def _round_up(n: int, block: int) -> int:
    return -(-n // block) * block


def _splash_block(length: int) -> int:
    return min(SPLASH_MAX_BLOCK, _round_up(length, 128))


def _splash_kernel(heads: int, lq: int, ls: int, offset: int, block_q: int, block_kv: int, interpret: bool,
                   softcap: float | None = None):
    from jax.experimental.pallas.ops.tpu import splash_attention as sa  # noqa: PLC0415 (TPU kernels: on use)

    mask = sa.MultiHeadMask([sa.CausalMask((lq, ls), offset=offset) for _ in range(heads)])
    blocks = sa.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
                           block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv,
                           block_q_dq=block_q, block_kv_dq=block_kv)
    return sa.make_splash_mha(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1, interpret=interpret,
                              attn_logits_soft_cap=softcap)


@jax.custom_vjp
def _stand_in(q: jax.Array, k: jax.Array, v: jax.Array, extra: object) -> jax.Array:
    """Memory stand-in of a fused kernel (see the module doc): q [B, L, H, Dh], k/v [B, S, K, Dh],
    `extra` what the kernel also reads (cuDNN's bias, Splash's segment ids) -> [B, L, H, Dh]."""
    return _stand_in_fwd(q, k, v, extra)[0]


def _stand_in_fwd(q, k, v, extra):
    g = q.shape[2] // k.shape[2]
    # the output and the float32 log-sum-exp [B, L, H] that flash kernels save for their backward
    lse = jnp.sum(q.astype(jnp.float32), axis=-1)
    out = q + jnp.repeat(jnp.mean(v, axis=1, keepdims=True) + jnp.mean(k, axis=1, keepdims=True), g, axis=2)
    return out, (q, k, v, extra, out, lse)


def _stand_in_bwd(residuals, d_out):
    q, k, v, extra, out, lse = residuals
    dq = d_out.astype(jnp.float32) * lse[..., None] + out.astype(jnp.float32)  # a float32 dq accumulator
    g = q.shape[2] // k.shape[2]
    d_kv = jnp.sum(d_out.reshape(*d_out.shape[:2], k.shape[2], g, -1), axis=(1, 3))[:, None]
    no_cotangent = jax.tree.map(lambda _: None, extra)  # a mask or segment ids
    return dq.astype(q.dtype), (k + d_kv).astype(k.dtype), (v + d_kv).astype(v.dtype), no_cotangent


_stand_in.defvjp(_stand_in_fwd, _stand_in_bwd)
