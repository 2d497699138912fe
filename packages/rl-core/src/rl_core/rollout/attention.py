"""The paged KV cache's layout and attention, chosen by platform.

Shapes: N queries (one token each), H query heads, K kv heads (G = H // K per
kv head), Dh head dim, P pages in the pool, ps tokens per page, M pages per
sequence, L layers.

A `PagedKV` owns both the pool's layout and the attention over it, because the
best layout depends on who reads it:
- `ReferenceKV` (plain JAX; CPU): page-major pools [L, P, ps, K, Dh], so a page
  is one contiguous block and gathering a sequence's pages is a row gather.
  Blocks of pages are folded in with an online softmax, for as many blocks as
  the longest query needs (a dynamic trip count: the work follows the actual
  lengths, not M, in one program).
- `PallasKV`: kv-head-major pools [L, K, P, ps, Dh], the layout of JAX's own
  paged-attention kernels, `jax.experimental.pallas.ops.tpu` on TPU and
  `...ops.gpu` (Triton) on GPU. No CPU kernel exists.
`auto` picks pallas on TPU and GPU, reference on CPU.

Called by the model once per layer as `kv(q, k, v, pages, layer, page_rows,
positions) -> (out [N, H, Dh], pages)`: token n's key/value go to its position's
slot (page `page_rows[n, pos // ps]`, offset `pos % ps`), then it attends to
slots 0..pos of its sequence, scores scaled by 1/sqrt(Dh), softmax in float32.
A sliding-window layer passes `window=W`: its tokens attend to slots pos-W+1..pos
only, and the reference attention reads only the pages those slots are in (the
Pallas kernels take no window: such a layer runs the reference attention over
the kernel's layout).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

ATTENTION_CHOICES = ("auto", "reference", "pallas")


def reference_paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_rows: jax.Array,
                              lengths: jax.Array, *, layer: jax.Array | int | None = None,
                              pages_per_block: int = 8, window: jax.Array | int | None = None,
                              sinks: jax.Array | None = None, kv_head_major: bool = False) -> jax.Array:
    """Attention of q [N, H, Dh] over page-major pages [P, ps, K, Dh] (or the whole pool
    [L, P, ps, K, Dh] and a `layer`: only the pages read are gathered; slicing the layer
    out first would copy it whole) -> [N, H, Dh]; query n sees slots 0..lengths[n] - 1, or
    with a `window` only the last `window` of them (the blocks before are not read);
    `sinks` [H]: each head's sink logit joins its softmax's denominator. `kv_head_major`: the pool is laid out [L, K, P, ps, Dh] (PallasKV's)."""
    q, k_pages, v_pages, page_rows, lengths = map(jnp.asarray, (q, k_pages, v_pages, page_rows, lengths))
    if layer is None:
        k_pages, v_pages, layer = k_pages[None], v_pages[None], 0
    n, h, dh = q.shape
    if kv_head_major:
        _, kv_heads, _, page_size, _ = k_pages.shape
    else:
        _, _, page_size, kv_heads, _ = k_pages.shape
    starts = jnp.zeros_like(lengths) if window is None else jnp.maximum(lengths - window, 0)
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
        if kv_head_major:  # [K, N, b, ps, Dh] -> [N, b * ps, K, Dh]
            k, v = (p[layer][:, ids].transpose(1, 2, 3, 0, 4).reshape(n, width, kv_heads, dh) for p in (k_pages, v_pages))
        else:  # whole pages: a row gather
            k = k_pages[layer, ids].reshape(n, width, kv_heads, dh)
            v = v_pages[layer, ids].reshape(n, width, kv_heads, dh)
        s = jnp.einsum("nkgd,nskd->nkgs", qg, k, preferred_element_type=jnp.float32) * scale
        slots = (j * width + jnp.arange(width))[None, :]
        valid = (slots < lengths[:, None]) & (slots >= starts[:, None])  # [N, width]
        s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
        new_top = jnp.maximum(top, jnp.max(s, axis=-1))
        # a query's first block may hold none of its slots: keep its state, no exp(-inf - -inf)
        safe_top = jnp.where(jnp.isfinite(new_top), new_top, 0.0)
        p = jnp.exp(s - safe_top[..., None])
        correction = jnp.exp(top - safe_top)
        total = total * correction + jnp.sum(p, axis=-1)
        pv = jnp.einsum("nkgs,nskd->nkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return new_top, total, acc * correction[..., None] + pv

    needed = (jnp.max(lengths) + width - 1) // width  # blocks the longest query reaches
    init = (
        jnp.full((n, kv_heads, g), -jnp.inf, jnp.float32),
        jnp.zeros((n, kv_heads, g), jnp.float32),
        jnp.zeros((n, kv_heads, g, dh), jnp.float32),
    )
    first = jnp.min(starts) // width  # blocks wholly before every query's window are not read
    top, total, acc = jax.lax.fori_loop(first, jnp.minimum(needed, blocks), block, init)
    if sinks is not None:  # one more logit per head, with no value: exp(sink - max) joins the denominator
        sink = jnp.asarray(sinks, jnp.float32).reshape(1, kv_heads, g)
        new_top = jnp.maximum(top, sink)
        correction = jnp.exp(top - new_top)
        total = total * correction + jnp.exp(sink - new_top)
        acc = acc * correction[..., None]
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


@dataclasses.dataclass(frozen=True)
class PagedKV:
    """A pool layout and the attention over it (see the module docstring)."""

    page_size: int
    pages_per_block: int = 8

    def pool_shape(self, layers: int, kv_heads: int, head_dim: int, num_pages: int) -> tuple[int, ...]:
        raise NotImplementedError

    def _slot(self, layer, page, offset) -> tuple:  # index of token slots in the pool
        raise NotImplementedError

    def _pages(self, page) -> tuple:  # index of whole pages (every layer) in the pool
        raise NotImplementedError

    def copy_pages(self, pages, src: jax.Array, dst: jax.Array):
        """Pool with pages `src` [S] copied onto pages `dst` [S] in every layer (0 -> 0: nothing)."""
        return tuple(p.at[self._pages(dst)].set(p[self._pages(src)]) for p in pages)

    def attend(self, q, k_pool, v_pool, layer, page_rows, lengths, window=None, sinks=None) -> jax.Array:
        raise NotImplementedError

    def init(self, layers: int, kv_heads: int, head_dim: int, dtype: Any, num_pages: int) -> tuple[jax.Array, jax.Array]:
        shape = self.pool_shape(layers, kv_heads, head_dim, num_pages)
        return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)

    def __call__(self, q, k, v, pages, layer, page_rows, positions, window=None, sinks=None
                 ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """q [N, H, Dh], k / v [N, K, Dh] of tokens at `positions` [N] -> (out [N, H, Dh], pages);
        `window` (int or traced int; None: none) keeps each token to its last `window` slots;
        `sinks` [H] (None: none) are the heads' sink logits."""
        page = jnp.take_along_axis(page_rows, (positions // self.page_size)[:, None], axis=1)[:, 0]
        slot = self._slot(layer, page, positions % self.page_size)
        # a scatter into the loop-carried pool: in place, nothing else is copied
        k_pool = pages[0].at[slot].set(k.astype(pages[0].dtype))
        v_pool = pages[1].at[slot].set(v.astype(pages[1].dtype))
        return self.attend(q, k_pool, v_pool, layer, page_rows, positions + 1, window, sinks), (k_pool, v_pool)


class ReferenceKV(PagedKV):
    """Page-major pools [L, P, ps, K, Dh], plain-JAX attention."""

    axes = ("layers", None, None, "kv_heads", "head_dim")  # logical names of the pool's axes

    def pool_shape(self, layers, kv_heads, head_dim, num_pages):
        return (layers, num_pages, self.page_size, kv_heads, head_dim)

    def _slot(self, layer, page, offset):
        return layer, page, offset  # -> [N, K, Dh]

    def _pages(self, page):
        return slice(None), page

    def attend(self, q, k_pool, v_pool, layer, page_rows, lengths, window=None, sinks=None):
        return reference_paged_attention(q, k_pool, v_pool, page_rows, lengths, layer=layer,
                                         pages_per_block=self.pages_per_block, window=window, sinks=sinks)


@dataclasses.dataclass(frozen=True)
class PallasKV(PagedKV):
    """KV-head-major pools [L, K, P, ps, Dh], JAX's Pallas paged-attention kernel for `platform`."""

    platform: str = "gpu"
    interpret: bool = False  # the Pallas interpreter (tests of the GPU kernel's call on CPU)

    axes = ("layers", "kv_heads", None, None, "head_dim")

    def pool_shape(self, layers, kv_heads, head_dim, num_pages):
        return (layers, kv_heads, num_pages, self.page_size, head_dim)

    def _slot(self, layer, page, offset):
        return layer, slice(None), page, offset  # -> [N, K, Dh] (the index arrays' axis first)

    def _pages(self, page):
        return slice(None), slice(None), page

    def attend(self, q, k_pool, v_pool, layer, page_rows, lengths, window=None, sinks=None):
        if window is not None or sinks is not None:  # the kernels take neither: the reference over this layout
            return reference_paged_attention(q, k_pool, v_pool, page_rows, lengths, layer=layer, window=window,
                                             sinks=sinks, pages_per_block=self.pages_per_block, kv_head_major=True)
        k, v = k_pool[layer], v_pool[layer]
        if self.platform == "tpu":
            return _pallas_tpu(q, k, v, page_rows, lengths, pages_per_block=self.pages_per_block)
        return _pallas_gpu(q, k, v, page_rows, lengths, pages_per_block=self.pages_per_block,
                           interpret=self.interpret)


GPU_PLATFORMS = ("gpu", "cuda", "rocm")


def choose(attention: str, page_size: int, platform: str | None = None, *, pages_per_block: int = 8) -> PagedKV:
    """The PagedKV for `attention` (auto | reference | pallas) on `platform` (default: JAX's backend)."""
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"rollout.attention = {attention!r}: must be one of {ATTENTION_CHOICES}")
    platform = platform or jax.default_backend()
    if attention == "auto":
        attention = "pallas" if platform in ("tpu", *GPU_PLATFORMS) else "reference"
    if attention == "reference":
        return ReferenceKV(page_size, pages_per_block)
    if platform == "tpu" or platform in GPU_PLATFORMS:
        return PallasKV(page_size, pages_per_block, platform="tpu" if platform == "tpu" else "gpu")
    raise ValueError(
        f"rollout.attention = 'pallas': JAX has paged-attention kernels for TPU and GPU only, and this "
        f"run's platform is {platform!r}; use 'reference' (or 'auto')"
    )
