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
  `...ops.gpu` (Triton) on GPU. No CPU kernel exists. The TPU kernel's blocks must
  be 128 lanes wide (Mosaic's vector tile), so on TPU a head dim under 128 packs
  f = 128 // Dh kv heads side by side into one 128-lane "lane group" (pools
  [L, ceil(K / f), P, ps, 128]): each query head is zero outside its own kv head's
  lanes, so q . k over the group is exactly q . k of its own head, and its output
  is read back from its own lanes. No memory is added when f divides K (Qwen2.5-0.5B,
  Llama 3.2 1B); other head dims are zero-padded up to a multiple of 128 lanes
  (`lane_layout` says which).
`auto` (and `pallas`) picks on TPU `RaggedKV` (rl_core.rollout.ragged: JAX's ragged kernel over one
K/V-combined pool; heads over 128 lanes keep `PallasKV` there), on GPU `PallasKV`, on CPU the reference.

Called by the model once per layer as `kv(q, k, v, pages, layer, page_rows,
positions) -> (out [N, H, Dh], pages)`: token n's key/value go to its position's
slot (page `page_rows[n, pos // ps]`, offset `pos % ps`), then it attends to
slots 0..pos of its sequence, scores scaled by 1/sqrt(Dh), softmax in float32.
A sliding-window layer passes `window=W`: its tokens attend to slots pos-W+1..pos
only, and the reference attention reads only the pages those slots are in (the
Pallas kernels take no window: such a layer runs the reference attention over
the kernel's layout). `softcap=c` soft-caps the scores, c * tanh(s / c), before the
mask (Gemma 2's attn_logit_softcapping): the reference attention and JAX's TPU kernel
(`attn_logits_soft_cap`) apply it; the GPU kernel has no cap, so there it runs the reference.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

ATTENTION_CHOICES = ("auto", "reference", "pallas")


LANES = 128  # a TPU vector register's lane count: the minor dim of every Mosaic block


def lane_layout(kv_heads: int, head_dim: int) -> tuple[int, int]:
    """(kv heads packed per lane group f, lanes per group) of the TPU kernel's pool: f = 128 // Dh
    heads (at most K) share 128 lanes when Dh divides 128; otherwise one head per group, its Dh
    rounded up to a multiple of 128 with zero lanes."""
    if LANES % head_dim == 0:
        return max(1, min(LANES // head_dim, kv_heads)), LANES
    return 1, -(-head_dim // LANES) * LANES


def tiled_groups(groups: int) -> int:
    """The lane-group count the kernel tiles (its 2C combined heads fill a bfloat16 tile of 16 rows, or
    are 2, 4 or 8 of them): `groups` rounded up to 1, 2, 4 or a multiple of 8."""
    for allowed in (1, 2, 4):
        if groups <= allowed:
            return allowed
    return -(-groups // 8) * 8


def pack_heads(x: jax.Array, pack: int, lanes: int) -> jax.Array:
    """[N, K, Dh] -> [N, ceil(K / pack), lanes]: kv heads v*pack .. v*pack + pack - 1 side by side
    in group v's lanes (zero heads and zero lanes pad the rest)."""
    n, kv_heads, dh = x.shape
    groups = -(-kv_heads // pack)
    x = jnp.pad(x, ((0, 0), (0, groups * pack - kv_heads), (0, 0))).reshape(n, groups, pack * dh)
    return jnp.pad(x, ((0, 0), (0, 0), (0, lanes - pack * dh)))


def unpack_heads(x: jax.Array, kv_heads: int, head_dim: int, pack: int) -> jax.Array:
    """Inverse of `pack_heads` on the last two axes: [..., groups, lanes] -> [..., K, Dh]."""
    lead, groups = x.shape[:-2], x.shape[-2]
    x = x[..., : pack * head_dim].reshape(*lead, groups * pack, head_dim)
    return x[..., :kv_heads, :]


def packed_queries(q: jax.Array, kv_heads: int, pack: int, lanes: int) -> jax.Array:
    """q [N, H, Dh] (heads kv-major, G per kv head) -> [N, groups * pack * G, lanes]: head (k, g)
    sits at row (k // pack, k % pack, g) of its group, in lanes (k % pack) * Dh .. + Dh, zeros elsewhere."""
    n, h, dh = q.shape
    g, groups = h // kv_heads, -(-kv_heads // pack)
    q = jnp.pad(q.reshape(n, kv_heads, g, dh), ((0, 0), (0, groups * pack - kv_heads), (0, 0), (0, 0)))
    q = q.reshape(n, groups, pack, g, dh)
    spread = jnp.einsum("nvigd,ij->nvigjd", q, jnp.eye(pack, dtype=q.dtype)).reshape(n, groups, pack * g, pack * dh)
    return jnp.pad(spread, ((0, 0), (0, 0), (0, 0), (0, lanes - pack * dh))).reshape(n, groups * pack * g, lanes)


def unpacked_output(o: jax.Array, kv_heads: int, heads: int, head_dim: int, pack: int) -> jax.Array:
    """The kernel's out [N, groups * pack * G, lanes] -> [N, H, Dh]: each head's own lanes."""
    n, g = o.shape[0], heads // kv_heads
    groups = -(-kv_heads // pack)
    o = o[..., : pack * head_dim].reshape(n, groups, pack, g, pack, head_dim)
    o = jnp.einsum("nvigjd,ij->nvigd", o, jnp.eye(pack, dtype=o.dtype)).reshape(n, groups * pack, g, head_dim)
    return o[:, :kv_heads].reshape(n, heads, head_dim)


def reference_paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_rows: jax.Array,
                              lengths: jax.Array, *, layer: jax.Array | int | None = None,
                              pages_per_block: int = 8, window: jax.Array | int | None = None,
                              sinks: jax.Array | None = None, kv_head_major: bool = False,
                              pack: int = 1, kv_heads: int | None = None, softcap: float | None = None,
                              combined: bool = False) -> jax.Array:
    """Attention of q [N, H, Dh] over page-major pages [P, ps, K, Dh] (or the whole pool
    [L, P, ps, K, Dh] and a `layer`: only the pages read are gathered; slicing the layer
    out first would copy it whole) -> [N, H, Dh]; query n sees slots 0..lengths[n] - 1, or
    with a `window` only the last `window` of them (the blocks before are not read);
    `sinks` [H]: each head's sink logit joins its softmax's denominator. `kv_head_major`: the pool is laid out [L, K, P, ps, Dh] (PallasKV's);
    with `pack` > 1 (or lanes wider than Dh) it is TPU's lane-packed [L, groups, P, ps, lanes] of `kv_heads` heads.
    `combined`: `k_pages` is the ragged kernel's pool [L, P, ps * 2C, lanes] of `kv_heads` heads (keys at
    combined head 2c, values at 2c + 1; rl_core.rollout.ragged) and `v_pages` is None."""
    q, k_pages, page_rows, lengths = map(jnp.asarray, (q, k_pages, page_rows, lengths))
    v_pages = None if combined else jnp.asarray(v_pages)
    if layer is None:
        k_pages, layer = k_pages[None], 0
        v_pages = None if combined else v_pages[None]
    n, h, dh = q.shape
    packed = kv_head_major and (pack > 1 or k_pages.shape[-1] != dh)
    if combined:  # [L, P, ps * 2C, lanes]: C lane groups (a count the kernel tiles, rl_core.rollout.ragged)
        pack = lane_layout(kv_heads, dh)[0]
        pairs = 2 * tiled_groups(-(-kv_heads // pack))
        page_size = k_pages.shape[2] // pairs
    elif kv_head_major:
        _, groups, _, page_size, _ = k_pages.shape
        kv_heads = kv_heads if packed else groups
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
        if combined:  # [N, b, ps, 2C, lanes]: keys at even combined heads, values at odd -> [N, b * ps, K, Dh]
            both = k_pages[layer, ids].reshape(n, per_block, page_size, pairs, -1)
            k, v = (unpack_heads(both[..., i::2, :], kv_heads, dh, pack).reshape(n, width, kv_heads, dh) for i in (0, 1))
        elif packed:  # [groups, N, b, ps, lanes] -> [N, b * ps, K, Dh]
            k, v = (unpack_heads(p[layer][:, ids].transpose(1, 2, 3, 0, 4), kv_heads, dh, pack).reshape(
                n, width, kv_heads, dh) for p in (k_pages, v_pages))
        elif kv_head_major:  # [K, N, b, ps, Dh] -> [N, b * ps, K, Dh]
            k, v = (p[layer][:, ids].transpose(1, 2, 3, 0, 4).reshape(n, width, kv_heads, dh) for p in (k_pages, v_pages))
        else:  # whole pages: a row gather
            k = k_pages[layer, ids].reshape(n, width, kv_heads, dh)
            v = v_pages[layer, ids].reshape(n, width, kv_heads, dh)
        s = jnp.einsum("nkgd,nskd->nkgs", qg, k, preferred_element_type=jnp.float32) * scale
        if softcap is not None:
            s = jnp.float32(softcap) * jnp.tanh(s / jnp.float32(softcap))
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


def _pallas_tpu(q, k_pages, v_pages, page_rows, lengths, *, pages_per_block: int, kv_heads: int, pack: int,
                softcap: float | None = None):
    """JAX's TPU kernel over the lane-packed pool [groups, P, ps, lanes] (see `lane_layout`)."""
    from jax.experimental.pallas.ops.tpu import paged_attention  # noqa: PLC0415 (TPU only)

    n, heads, dh = q.shape
    scaled = (q.astype(jnp.float32) / math.sqrt(dh)).astype(q.dtype)
    block = min(pages_per_block, page_rows.shape[1])
    # the kernel multiplies float32 queries by the pool's bfloat16 keys, which Mosaic compiles only at
    # the default precision (not under a caller's `highest`)
    with jax.default_matmul_precision("default"):
        out = paged_attention.paged_attention(packed_queries(scaled, kv_heads, pack, k_pages.shape[-1]), k_pages,
                                              v_pages, lengths, _padded_rows(page_rows, block),
                                              pages_per_compute_block=block, attn_logits_soft_cap=softcap)
    return unpacked_output(out, kv_heads, heads, dh, pack)


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

    def attend(self, q, k_pool, v_pool, layer, page_rows, lengths, window=None, sinks=None, *,
               kv_heads: int, softcap: float | None = None) -> jax.Array:
        raise NotImplementedError

    def pool_axes(self, pools: int) -> tuple:
        """Logical names of the axes of a pool of `pools` arrays."""
        return self.axes

    def _stored(self, x: jax.Array) -> jax.Array:
        """A token's keys or values [N, K, Dh] as the pool holds them (as they are, but for TPU's packing)."""
        return x

    def init(self, layers: int, kv_heads: int, head_dim: int, dtype: Any, num_pages: int) -> tuple[jax.Array, jax.Array]:
        shape = self.pool_shape(layers, kv_heads, head_dim, num_pages)
        return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)

    def __call__(self, q, k, v, pages, layer, page_rows, positions, window=None, sinks=None, softcap=None
                 ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """q [N, H, Dh], k / v [N, K, Dh] of tokens at `positions` [N] -> (out [N, H, Dh], pages);
        `window` (int or traced int; None: none) keeps each token to its last `window` slots;
        `sinks` [H] (None: none) are the heads' sink logits; `softcap` (None: none) caps the scores."""
        page = jnp.take_along_axis(page_rows, (positions // self.page_size)[:, None], axis=1)[:, 0]
        slot = self._slot(layer, page, positions % self.page_size)
        # a scatter into the loop-carried pool: in place, nothing else is copied
        k_pool = pages[0].at[slot].set(self._stored(k).astype(pages[0].dtype))
        v_pool = pages[1].at[slot].set(self._stored(v).astype(pages[1].dtype))
        out = self.attend(q, k_pool, v_pool, layer, page_rows, positions + 1, window, sinks, kv_heads=k.shape[1],
                          softcap=softcap)
        return out, (k_pool, v_pool)


class ReferenceKV(PagedKV):
    """Page-major pools [L, P, ps, K, Dh], plain-JAX attention."""

    axes = ("layers", None, None, "kv_heads", "head_dim")  # logical names of the pool's axes

    def pool_shape(self, layers, kv_heads, head_dim, num_pages):
        return (layers, num_pages, self.page_size, kv_heads, head_dim)

    def _slot(self, layer, page, offset):
        return layer, page, offset  # -> [N, K, Dh]

    def _pages(self, page):
        return slice(None), page

    def attend(self, q, k_pool, v_pool, layer, page_rows, lengths, window=None, sinks=None, *, kv_heads=None,
               softcap=None):
        return reference_paged_attention(q, k_pool, v_pool, page_rows, lengths, layer=layer,
                                         pages_per_block=self.pages_per_block, window=window, sinks=sinks,
                                         softcap=softcap)


@dataclasses.dataclass(frozen=True)
class PallasKV(PagedKV):
    """KV-head-major pools, JAX's Pallas paged-attention kernel for `platform`: [L, K, P, ps, Dh] on
    GPU, lane-packed [L, groups, P, ps, lanes] on TPU (`lane_layout`)."""

    platform: str = "gpu"
    interpret: bool = False  # the Pallas interpreter (tests of the GPU kernel's call on CPU)

    axes = ("layers", "kv_heads", None, None, "head_dim")

    def layout(self, kv_heads: int, head_dim: int) -> tuple[int, int]:
        """(kv heads per lane group, lanes per group) of this platform's pool."""
        return lane_layout(kv_heads, head_dim) if self.platform == "tpu" else (1, head_dim)

    def pool_shape(self, layers, kv_heads, head_dim, num_pages):
        pack, lanes = self.layout(kv_heads, head_dim)
        return (layers, -(-kv_heads // pack), num_pages, self.page_size, lanes)

    def _slot(self, layer, page, offset):
        return layer, slice(None), page, offset  # -> [N, groups, lanes] (the index arrays' axis first)

    def _pages(self, page):
        return slice(None), slice(None), page

    def _stored(self, x):
        pack, lanes = self.layout(x.shape[1], x.shape[2])
        return x if (pack, lanes) == (1, x.shape[2]) else pack_heads(x, pack, lanes)

    def attend(self, q, k_pool, v_pool, layer, page_rows, lengths, window=None, sinks=None, *, kv_heads: int,
               softcap=None):
        """`kv_heads`: the model's (a lane-packed pool's shape holds its groups, not its heads)."""
        pack, _ = self.layout(kv_heads, q.shape[-1])
        # the kernels take neither a window nor sinks; and Mosaic does not compile the TPU kernel's
        # float32 products at `highest` precision (at the default they are bfloat16 passes), so float32
        # pools (checks against the static engine, not real runs) also take XLA's attention over this layout
        gpu_cap = softcap is not None and self.platform != "tpu"  # the GPU kernel has no soft cap
        float32_tpu = self.platform == "tpu" and k_pool.dtype == jnp.float32
        if window is not None or sinks is not None or gpu_cap or float32_tpu:
            return reference_paged_attention(q, k_pool, v_pool, page_rows, lengths, layer=layer, window=window,
                                             sinks=sinks, pages_per_block=self.pages_per_block, kv_head_major=True,
                                             pack=pack, kv_heads=kv_heads, softcap=softcap)
        k, v = k_pool[layer], v_pool[layer]
        if self.platform == "tpu":
            return _pallas_tpu(q, k, v, page_rows, lengths, pages_per_block=self.pages_per_block, kv_heads=kv_heads,
                               pack=pack, softcap=softcap)
        return _pallas_gpu(q, k, v, page_rows, lengths, pages_per_block=self.pages_per_block,
                           interpret=self.interpret)


GPU_PLATFORMS = ("gpu", "cuda", "rocm")
TPU_BLOCK_TOKENS = 512
"""Tokens of a TPU kernel block of pages (its double-buffered k/v: 512 x 2 x 128 lanes x 2 bytes x 2 = 512 KiB
of VMEM a lane group; JAX's paged_attention measured best at 512 on a v5e, docs/results/2026-12-06-tpu-chip.md)."""
TPU_QUERIES_PER_BLOCK = 1
"""Query tokens a grid step of the TPU ragged kernel takes (`RaggedKV.queries_per_block`)."""


def choose(attention: str, page_size: int, platform: str | None = None, *, pages_per_block: int = 8) -> PagedKV:
    """The PagedKV for `attention` (auto | reference | pallas) on `platform` (default: JAX's backend)."""
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"rollout.options.attention = {attention!r}: must be one of {ATTENTION_CHOICES}")
    platform = platform or jax.default_backend()
    if attention == "auto":
        attention = "pallas" if platform in ("tpu", *GPU_PLATFORMS) else "reference"
    if attention == "reference":
        return ReferenceKV(page_size, pages_per_block)
    if platform == "tpu":
        from rl_core.rollout.ragged import RaggedKV  # noqa: PLC0415 (it builds on this module)

        # JAX's ragged kernel over the combined pool; its blocks of pages are copied whole (past a
        # row's length too), and fewer, larger blocks cost fewer loop steps: 512 tokens measured best
        return RaggedKV(page_size, max(1, TPU_BLOCK_TOKENS // page_size), TPU_QUERIES_PER_BLOCK)
    if platform in GPU_PLATFORMS:
        return PallasKV(page_size, pages_per_block, platform="gpu")
    raise ValueError(
        f"rollout.options.attention = 'pallas': JAX has paged-attention kernels for TPU and GPU only, and this "
        f"run's platform is {platform!r}; use 'reference' (or 'auto')"
    )
