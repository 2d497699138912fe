"""Decode time per token against context length: a sliding-window layer's attention against full attention.

    uv run python benchmarks/windowed_decode.py [--contexts 512 1024 2048 4096 8192 16384] [--window 256]
        [--batch 8] [--repeats 50] [--engine paged|static]

paged (default): the paged engine's attention for one decoding step of one layer
(`reference_paged_attention`, the CPU engine's: 16-token pages, 4 query / 2 KV heads of 64,
float32), one query per row at length C, over the pool's pages, with and without a window. A
windowed layer reads only the blocks of pages its window reaches, so its time should stay flat in
C while full attention's grows with it. Beside them, the
attention a windowed layer of a model that also has global layers (Gemma 3) runs in the paged
engine: a ring of `--window` slots per row (`rl_models.paged_window.ring_attention`, decoding:
the token's key written, then its row read), whatever C.

static: one decoding step of a one-layer model (D 256, 4 query / 2 KV heads of 64, float32) as the
static sampler runs it (the model's cached call, its cache donated and written in place), each row
at slot C - 1 of a C-slot cache: full attention; a windowed layer over the full-length cache (the
window a mask, as before 2026-12-05); a windowed layer over its ring of W slots
(`init_decode_cache`, rl_models.rings).

Times are medians over `--repeats` calls after a warm-up.
"""

from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from flax import nnx

from rl_core.rollout import reference_paged_attention
from rl_models import Transformer, TransformerConfig
from rl_models.paged_window import ring_attention
from timing import times


def median_seconds(fn, repeats: int) -> float:
    return statistics.median(times(fn, repeats))


def paged_attention_seconds(window: int | None, context: int, batch: int, repeats: int) -> float:
    page, heads, kv_heads, dh = 16, 4, 2, 64
    pages_per_row = -(-context // page)
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(batch, heads, dh)).astype(np.float32))
    pool = [jnp.asarray(rng.normal(size=(1, batch * pages_per_row + 1, page, kv_heads, dh)).astype(np.float32))
            for _ in range(2)]
    rows = jnp.asarray(1 + np.arange(batch * pages_per_row).reshape(batch, pages_per_row), jnp.int32)
    lengths = jnp.full((batch,), context, jnp.int32)
    fn = jax.jit(lambda q, k, v: reference_paged_attention(q, k, v, rows, lengths, layer=0, window=window))
    return median_seconds(lambda: fn(q, *pool), repeats)


def ring_attention_seconds(window: int, context: int, batch: int, repeats: int) -> float:
    heads, kv_heads, dh = 4, 2, 64
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(batch, heads, dh)).astype(np.float32))
    k, v = (jnp.asarray(rng.normal(size=(batch, kv_heads, dh)).astype(np.float32)) for _ in range(2))
    rings = tuple(jnp.asarray(rng.normal(size=(1, batch + 1, window, kv_heads, dh)).astype(np.float32))
                  for _ in range(2))
    rows = jnp.arange(1, batch + 1, dtype=jnp.int32)
    positions = jnp.full((batch,), context - 1, jnp.int32)  # the query at length C
    fn = jax.jit(lambda q, k, v, rings: ring_attention(q, k, v, rings, 0, rows, positions, window, sequence=False)[0])
    return median_seconds(lambda: fn(q, k, v, rings), repeats)


def static_step_seconds(window: int | None, ring: bool, context: int, batch: int, repeats: int) -> float:
    config = TransformerConfig.tiny(256, hidden_size=256, num_layers=1, head_dim=64, sliding_window=window)
    model = Transformer(config, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    cache = model.init_decode_cache(batch, context) if ring else model.init_cache(batch, context)
    token = jnp.ones((batch, 1), jnp.int32)
    position = jnp.full((batch, 1), context - 1, jnp.int32)
    mask = jnp.ones((batch, 1, context), bool)
    step = jax.jit(lambda state, cache: nnx.merge(graphdef, state)(token, position, mask, cache, context - 1),
                   donate_argnums=1)
    held = [cache]

    def run():
        hidden, held[0] = step(state, held[0])
        return hidden

    return median_seconds(run, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--engine", choices=("paged", "static"), default="paged")
    args = parser.parse_args()
    print(f"backend {jax.default_backend()}, batch {args.batch}, window {args.window}; ms per layer and token")
    if args.engine == "static":
        print(f"{'context':>8} | {'full':>8} {'masked':>8} {'ring':>8} {'full/ring':>9}")
        for context in args.contexts:
            full, masked, ring = (static_step_seconds(w, r, context, args.batch, args.repeats) * 1e3
                                  for w, r in ((None, False), (args.window, False), (args.window, True)))
            print(f"{context:>8} | {full:>8.3f} {masked:>8.3f} {ring:>8.3f} {full / ring:>9.2f}")
        return
    print(f"{'context':>8} | {'full':>8} {'windowed':>9} {'ratio':>6} | {'ring':>8}")
    for context in args.contexts:
        full = paged_attention_seconds(None, context, args.batch, args.repeats) * 1e3
        windowed = paged_attention_seconds(args.window, context, args.batch, args.repeats) * 1e3
        ring = ring_attention_seconds(args.window, context, args.batch, args.repeats) * 1e3
        print(f"{context:>8} | {full:>8.3f} {windowed:>9.3f} {full / windowed:>6.2f} | {ring:>8.3f}")


if __name__ == "__main__":
    main()
