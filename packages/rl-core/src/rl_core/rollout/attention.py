"""Attention of single-token queries over a paged KV cache, chosen by platform.

Shapes: N queries, H query heads, K kv heads (G = H // K per kv head), Dh head
dim, P pages in the pool, ps tokens per page, M pages per sequence.

Every implementation takes q [N, H, Dh], k_pages / v_pages [K, P, ps, Dh],
page_rows [N, M] int32 and lengths [N] int32 (query n attends to the first
lengths[n] >= 1 slots of its sequence) and returns [N, H, Dh] in q's dtype,
with scores scaled by 1/sqrt(Dh).

- `reference`: plain JAX. Blocks of pages are gathered and folded in with an
  online softmax, for as many blocks as the longest query needs (a dynamic
  trip count: the work follows the actual lengths, not M, in one program).
- `pallas`: JAX's own paged-attention kernels, `jax.experimental.pallas.ops.tpu`
  on TPU and `...ops.gpu` (Triton) on GPU. No CPU kernel exists.
`auto` picks pallas on TPU and GPU, reference on CPU.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

ATTENTION_CHOICES = ("auto", "reference", "pallas")

PagedAttention = Callable[[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


def reference_paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_rows: jax.Array,
                              lengths: jax.Array, *, pages_per_block: int = 8) -> jax.Array:
    """Paged attention in plain JAX (see the module docstring); float32 scores and softmax."""
    q, k_pages, v_pages, page_rows, lengths = map(jnp.asarray, (q, k_pages, v_pages, page_rows, lengths))
    n, h, dh = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    g = h // kv_heads
    m = page_rows.shape[1]
    per_block = min(pages_per_block, m)
    blocks = -(-m // per_block)
    page_rows = jnp.pad(page_rows, ((0, 0), (0, blocks * per_block - m)))  # padding points at scratch page 0
    width = per_block * page_size
    qg = q.reshape(n, kv_heads, g, dh)
    scale = 1.0 / math.sqrt(dh)

    def block(j, carry):
        top, total, acc = carry  # running max [N, K, G], denominator [N, K, G], numerator [N, K, G, Dh]
        ids = jax.lax.dynamic_slice_in_dim(page_rows, j * per_block, per_block, axis=1)  # [N, b]
        k = k_pages[:, ids].reshape(kv_heads, n, width, dh)
        v = v_pages[:, ids].reshape(kv_heads, n, width, dh)
        s = jnp.einsum("nkgd,knsd->nkgs", qg, k, preferred_element_type=jnp.float32) * scale
        valid = (j * width + jnp.arange(width))[None, :] < lengths[:, None]  # [N, width]
        s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
        new_top = jnp.maximum(top, jnp.max(s, axis=-1))  # finite: slot 0 of block 0 is always valid
        p = jnp.exp(s - new_top[..., None])
        correction = jnp.exp(top - new_top)
        total = total * correction + jnp.sum(p, axis=-1)
        pv = jnp.einsum("nkgs,knsd->nkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return new_top, total, acc * correction[..., None] + pv

    needed = (jnp.max(lengths) + width - 1) // width  # blocks the longest query reaches
    init = (
        jnp.full((n, kv_heads, g), -jnp.inf, jnp.float32),
        jnp.zeros((n, kv_heads, g), jnp.float32),
        jnp.zeros((n, kv_heads, g, dh), jnp.float32),
    )
    _, total, acc = jax.lax.fori_loop(0, jnp.minimum(needed, blocks), block, init)
    return (acc / total[..., None]).reshape(n, h, dh).astype(q.dtype)


def _padded_rows(page_rows: jax.Array, multiple: int) -> jax.Array:
    """Page rows widened to a multiple of `multiple` pages with scratch page 0 (past every length)."""
    return jnp.pad(page_rows, ((0, 0), (0, -page_rows.shape[1] % multiple)))


def _pallas_tpu(q, k_pages, v_pages, page_rows, lengths, *, pages_per_block: int):
    from jax.experimental.pallas.ops.tpu import paged_attention  # noqa: PLC0415 (TPU only)

    scaled = (q.astype(jnp.float32) / math.sqrt(q.shape[-1])).astype(q.dtype)
    block = min(pages_per_block, page_rows.shape[1])
    return paged_attention.paged_attention(scaled, k_pages, v_pages, lengths, _padded_rows(page_rows, block),
                                           pages_per_compute_block=block)


def _pallas_gpu(q, k_pages, v_pages, page_rows, lengths, *, pages_per_block: int, interpret: bool = False):
    from jax.experimental.pallas.ops.gpu import paged_attention  # noqa: PLC0415 (Triton)

    scaled = (q.astype(jnp.float32) / math.sqrt(q.shape[-1])).astype(q.dtype)
    block = min(pages_per_block, page_rows.shape[1])
    # the kernel splits each sequence's pages into k_splits partitions of whole compute blocks
    splits = max(1, min(16, page_rows.shape[1] // block))
    return paged_attention.paged_attention(scaled, k_pages, v_pages, _padded_rows(page_rows, splits * block), lengths,
                                           pages_per_compute_block=block, k_splits=splits, interpret=interpret)


def choose(attention: str, platform: str | None = None, *, pages_per_block: int = 8) -> PagedAttention:
    """The paged-attention function for `attention` (auto | reference | pallas) on `platform`
    (default: JAX's default backend)."""
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"rollout.attention = {attention!r}: must be one of {ATTENTION_CHOICES}")
    platform = platform or jax.default_backend()
    if attention == "auto":
        attention = "pallas" if platform in ("tpu", "gpu", "cuda", "rocm") else "reference"
    if attention == "reference":
        return functools.partial(reference_paged_attention, pages_per_block=pages_per_block)
    if platform == "tpu":
        return functools.partial(_pallas_tpu, pages_per_block=pages_per_block)
    if platform in ("gpu", "cuda", "rocm"):
        return functools.partial(_pallas_gpu, pages_per_block=pages_per_block)
    raise ValueError(
        f"rollout.attention = 'pallas': JAX has paged-attention kernels for TPU and GPU only, and this "
        f"run's platform is {platform!r}; use 'reference' (or 'auto')"
    )
