"""The paged KV cache on TPU: one pool with keys and values side by side, read by JAX's Pallas
`ragged_paged_attention` kernel (the one tpu-inference serves with).

Shapes as in rl_core.rollout.attention: N queries (one token each), H query heads, K kv heads
(G = H // K per kv head), Dh head dim, P pages, ps tokens per page, M pages per sequence, L layers.

The pool is [L, P, ps * 2C, lanes]: C lane groups (`ragged_layout`), each one's keys at combined
head 2c and its values at 2c + 1 of a slot's 2C rows, the layout the kernel reads as
[L * P, ps, 2C, lanes]. It is stored with slots and heads in one axis because XLA:TPU lays an array
whose second-minor axis is as small as 2C out with that axis moved (less padding), and then copies
the whole pool into the kernel's row-major layout before every call (seen compiling the engine's
step for a v5e ahead of time: three copies of the pool a call); 128 rows keep the usual tiling, the
same bytes as the kernel's view. A group is `lane_layout`'s: heads of
64 (or 32, 16) are packed side by side into 128 lanes, 80 and 96 are zero-padded to 128, 128 and
256 are the kernel's own widths; the queries are spread so that each one is zero outside its own
head's lanes (`packed_queries`), so its scores and output over the group are exactly its own
head's. C is padded up to a count the kernel tiles (1, 2, 4 or a multiple of 8) with zero groups.

The kernel gets the whole pool as [L * P, ps, 2C, lanes] (a free reshape) and page ids offset by
`layer * P`: it reads only the pages it needs straight from HBM, where slicing one layer out of the
pool for it would copy the layer (tens of MB per layer per step at the 0.5B shape). Each token is
its own sequence to it (query length 1, kv length its position + 1), so a decode step and a prefill
chunk are the same call, as in the engine.

Head dims over 128 (Gemma's 256) keep JAX's `paged_attention` kernel over its own two pools
(`PallasKV`'s lane-packed [L, K, P, ps, lanes] keys and values): the ragged kernel's strided load of
K/V bitcasts 128-lane rows only (Mosaic, compiling it ahead of time for a v5e: "The last dim size is
not 128 in original base memref"), and `paged_attention` compiles at 256.

What the kernel does not do runs XLA's attention over this same layout (`reference_paged_attention`
with `combined=True`), decided in `RaggedKV.kernel_refuses`, the one place:
- a float32 pool: Mosaic compiles the kernel's float32 products only at the default precision
  (bfloat16 passes), and float32 pools are for checks against the static engine at `highest`;
- a traced window (a model whose pooled layers have different windows, scanned): the kernel takes a
  static `sliding_window` (a Python int window runs in the kernel);
- sink logits (gpt-oss): the kernel has none.
Soft-capping (Gemma 2) runs in the kernel (`soft_cap`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator

import jax
import jax.numpy as jnp

from rl_core.rollout.attention import (LANES, PagedKV, PallasKV, packed_queries, unpacked_output, lane_layout,
                                       pack_heads, reference_paged_attention, tiled_groups)

VMEM_KV_BYTES = 4 << 20
"""The kernel's double-buffered block of pages is kept under this (v5e's default scoped VMEM is 16 MiB)."""


LOWERING_DEVICE_KIND = "TPU v5 lite"
"""The chip a CPU host lowers TPU programs for (a v5e): Mosaic's lowering of the kernel asks the device
kind (its integer division does), and a CPU host has none."""


@contextlib.contextmanager
def tpu_kind_for_lowering() -> Iterator[None]:
    """Lower TPU programs on a host that has no TPU: the default device's kind is `LOWERING_DEVICE_KIND`
    (through an abstract mesh of one device, the only place Mosaic reads a kind from other than the
    device). On a TPU host (or under a caller's own abstract mesh) nothing changes."""
    if jax.default_backend() == "tpu" or not jax.sharding.get_abstract_mesh().empty:
        yield
        return
    device = jax.sharding.AbstractDevice(device_kind=LOWERING_DEVICE_KIND, num_cores=1, platform="tpu")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("chip",), abstract_device=device)):
        yield


def ragged_layout(kv_heads: int, head_dim: int) -> tuple[int, int, int]:
    """(kv heads per lane group, lanes per group, lane groups C) of the combined pool."""
    pack, lanes = lane_layout(kv_heads, head_dim)
    return pack, lanes, tiled_groups(-(-kv_heads // pack))


def wide(kv_heads: int, head_dim: int) -> bool:
    """Whether a head takes more than 128 lanes: the pool is then `PallasKV`'s (see the module docstring)."""
    return lane_layout(kv_heads, head_dim)[1] > LANES


def token_lanes(kv_heads: int, head_dim: int) -> int:
    """Lanes a token's keys (or its values) take in one layer of the TPU pool."""
    pack, lanes, groups = ragged_layout(kv_heads, head_dim)
    return (-(-kv_heads // pack) if wide(kv_heads, head_dim) else groups) * lanes


def combined_slots(k: jax.Array, v: jax.Array, pack: int, lanes: int, groups: int) -> jax.Array:
    """A token's keys and values [N, K, Dh] each -> [N, 2C, lanes]: group c's keys at 2c, values at 2c + 1."""
    k, v = (pack_heads(x, pack, lanes) for x in (k, v))
    pad = ((0, 0), (0, groups - k.shape[1]), (0, 0))
    return jnp.stack([jnp.pad(k, pad), jnp.pad(v, pad)], axis=2).reshape(k.shape[0], 2 * groups, lanes)


def block_pages(pages_per_block: int, pages_per_sequence: int, page_size: int, combined_per_block: int,
                lanes: int, itemsize: int) -> int:
    """Pages of one kernel block: `pages_per_block`, at most a sequence's, and its two buffers in
    `VMEM_KV_BYTES`."""
    fit = VMEM_KV_BYTES // (2 * page_size * combined_per_block * lanes * itemsize)
    return max(1, min(pages_per_block, pages_per_sequence, fit))


def ragged_tpu(q: jax.Array, pool: jax.Array, layer: jax.Array | int, page_rows: jax.Array, lengths: jax.Array, *,
               kv_heads: int, pages_per_block: int, queries_per_block: int = 1, window: int | None = None,
               softcap: float | None = None, as_its_reference: bool = False) -> jax.Array:
    """JAX's `ragged_paged_attention` of q [N, H, Dh] over layer `layer` of the combined pool
    [L, P, ps * 2C, lanes] -> [N, H, Dh]; query n is its own sequence of length `lengths[n]`. Block
    sizes are given (the kernel's own table asks the device kind, which a CPU host lowering for TPU
    has not). `as_its_reference`: the same inputs to the kernel's plain-JAX statement of what it
    computes (`ref_ragged_paged_attention`, eager only): how a CPU checks these inputs, since neither
    Pallas interpreter runs this kernel in JAX 0.10.2 (a reshaped ref, a masked store on an indexed ref)."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel  # noqa: PLC0415 (TPU only)

    n, heads, dh = q.shape
    pack, lanes, groups = ragged_layout(kv_heads, dh)
    layers, num_pages, rows_per_page, _ = pool.shape
    combined = 2 * groups
    page_size = rows_per_page // combined
    packed = packed_queries(q, kv_heads, pack, lanes)  # [N, ceil(K / pack) * pack * G, lanes]
    per_group = packed.shape[1] // -(-kv_heads // pack)
    packed = jnp.pad(packed, ((0, 0), (0, groups * per_group - packed.shape[1]), (0, 0))).astype(pool.dtype)
    _, combined_per_block = kernel.get_min_heads_per_blk(packed.shape[1], combined, packed.dtype, pool.dtype)
    m = page_rows.shape[1]
    rows = (page_rows + jnp.asarray(layer, jnp.int32) * num_pages).astype(jnp.int32)
    args = (packed, pool.reshape(layers * num_pages, page_size, combined, lanes), lengths.astype(jnp.int32), rows,
            jnp.arange(n + 1, dtype=jnp.int32), jnp.array([n], jnp.int32))
    options = dict(sm_scale=1.0 / math.sqrt(dh), sliding_window=window, soft_cap=softcap)
    if as_its_reference:
        out = kernel.ref_ragged_paged_attention(*args, **options)
    else:  # its probabilities (float32) times the pool's bfloat16 values compile only at the default
        # precision (Mosaic refused them under a caller's `highest`: docs/results/2026-12-06-tpu-chip.md)
        with jax.default_matmul_precision("default"):
            out = kernel.ragged_paged_attention(
                *args, **options, num_queries_per_block=max(1, min(queries_per_block, n)),
                num_kv_pages_per_block=block_pages(pages_per_block, m, page_size, combined_per_block, lanes,
                                                   pool.dtype.itemsize))
    return unpacked_output(out[:, : -(-kv_heads // pack) * per_group], kv_heads, heads, dh, pack).astype(q.dtype)


@dataclasses.dataclass(frozen=True)
class RaggedKV(PagedKV):
    """The combined pool [L, P, ps * 2C, lanes] (one array: `init` gives a 1-tuple) and JAX's ragged
    paged-attention kernel over it (see the module docstring)."""

    queries_per_block: int = 1
    """Query tokens a kernel grid step takes. Each is its own sequence here, and the kernel computes a
    block's every query against each of its sequences' pages: one is the least work for decode."""

    axes = ("layers", None, None, None)
    """The combined pool's [L, P, ps * 2C, lanes]: its kv heads share lanes and slots with each other,
    so no axis is theirs alone to split over `tensor` (each tensor shard holds every head's pages)."""

    def paged(self) -> PallasKV:
        """The layout and kernel of heads over 128 lanes (`wide`)."""
        return PallasKV(self.page_size, self.pages_per_block, platform="tpu")

    def pool_axes(self, pools: int) -> tuple:
        return PallasKV.axes if pools == 2 else self.axes

    def pool_shape(self, layers, kv_heads, head_dim, num_pages):
        if wide(kv_heads, head_dim):
            return self.paged().pool_shape(layers, kv_heads, head_dim, num_pages)
        _, lanes, groups = ragged_layout(kv_heads, head_dim)
        return (layers, num_pages, self.page_size * 2 * groups, lanes)

    def init(self, layers, kv_heads, head_dim, dtype, num_pages):
        if wide(kv_heads, head_dim):
            return self.paged().init(layers, kv_heads, head_dim, dtype, num_pages)
        return (jnp.zeros(self.pool_shape(layers, kv_heads, head_dim, num_pages), dtype),)

    def _pages(self, page):
        return slice(None), page

    def copy_pages(self, pages, src, dst):
        return self.paged().copy_pages(pages, src, dst) if len(pages) == 2 else super().copy_pages(pages, src, dst)

    @staticmethod
    def kernel_refuses(pool: jax.Array, window, sinks) -> str | None:
        """Why this call runs XLA's attention over the pool instead of the kernel (None: it does not)."""
        if pool.dtype == jnp.float32:
            return "a float32 pool (checks at `highest` precision, which Mosaic does not compile)"
        if window is not None and not isinstance(window, int):
            return "a traced window (the kernel's sliding_window is static)"
        if sinks is not None:
            return "sink logits (the kernel has none)"
        return None

    def attend(self, q, pool, layer, page_rows, lengths, window=None, sinks=None, *, kv_heads: int, softcap=None):
        if self.kernel_refuses(pool, window, sinks) is not None:
            return reference_paged_attention(q, pool, None, page_rows, lengths, layer=layer, window=window,
                                             sinks=sinks, pages_per_block=self.pages_per_block, combined=True,
                                             kv_heads=kv_heads, softcap=softcap)
        return ragged_tpu(q, pool, layer, page_rows, lengths, kv_heads=kv_heads, pages_per_block=self.pages_per_block,
                          queries_per_block=self.queries_per_block, window=window, softcap=softcap)

    def __call__(self, q, k, v, pages, layer, page_rows, positions, window=None, sinks=None, softcap=None):
        """`PagedKV.__call__` over the one combined pool: `pages` is (pool,) (or `PallasKV`'s two, `wide`)."""
        if len(pages) == 2:
            return self.paged()(q, k, v, pages, layer, page_rows, positions, window, sinks, softcap)
        (pool,) = pages
        pack, lanes, groups = ragged_layout(k.shape[1], k.shape[2])
        page = jnp.take_along_axis(page_rows, (positions // self.page_size)[:, None], axis=1)[:, 0]
        # a scatter into the loop-carried pool: in place, nothing else is copied
        first = (positions % self.page_size) * 2 * groups  # the slot's first row in its page
        pool = pool.at[layer, page[:, None], first[:, None] + jnp.arange(2 * groups)].set(
            combined_slots(k, v, pack, lanes, groups).astype(pool.dtype))
        out = self.attend(q, pool, layer, page_rows, positions + 1, window, sinks, kv_heads=k.shape[1], softcap=softcap)
        return out, (pool,)
