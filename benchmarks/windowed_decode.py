"""Decode time per token against context length: sliding-window layers against full attention.

    uv run python benchmarks/windowed_decode.py [--contexts 512 1024 2048 4096 8192] [--window 256]
        [--batch 8] [--repeats 20]

Two models of the same size (D=256, 2 layers, 4 query / 2 KV heads of 64, SwiGLU 1024, 512
ids, float32, random weights), one with every layer windowed (`sliding_window`, Mistral's
layout), one with full attention. For each context length C, the static sampler's decoding step
after a C-token prompt (generating 129 tokens less generating 1, over 128 steps); then the paged
engine's attention alone (`reference_paged_attention`, 16-token pages) for one query per row at
length C, with and without the window. Times are medians over
`--repeats` calls after a warm-up. A windowed layer reads only its window, so its time should
stay flat in C while full attention's grows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_core.rollout.attention import reference_paged_attention
from rl_core.rollout.sampler import GREEDY, Sampler
from rl_models import Transformer, TransformerConfig


NEW = 129
"""Tokens generated per timed call (the first comes from the prefill)."""


def median_seconds(fn, repeats: int) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def decode_step_seconds(window: int | None, context: int, batch: int, repeats: int) -> float:
    """Seconds per decoding step of the static sampler after a `context`-token prompt: a generation
    of NEW tokens less one of a single token (the prefill and its first token), over NEW - 1 steps."""
    config = TransformerConfig(vocab_size=512, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
                               head_dim=64, mlp_hidden_size=1024, sliding_window=window)
    graphdef, state = nnx.split(Transformer(config, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(3, 512, (batch, context)), jnp.int32)
    mask = jnp.ones((batch, context), jnp.int32)
    times = {}
    for new in (1, NEW):
        sampler = Sampler(graphdef, max_new_tokens=new, eos_ids=(10_000,), pad_id=0)  # no EOS: every step runs
        times[new] = median_seconds(lambda: sampler(state, prompts, mask, jax.random.key(0), GREEDY).tokens, repeats)
    return (times[NEW] - times[1]) / (NEW - 1)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(f"backend {jax.default_backend()}, batch {args.batch}, window {args.window}; ms per decoding step")
    print(f"{'context':>8} | {'model step full':>15} {'windowed':>9} {'ratio':>6} | "
          f"{'paged attn full':>15} {'windowed':>9} {'ratio':>6}")
    for context in args.contexts:
        full = decode_step_seconds(None, context, args.batch, args.repeats) * 1e3
        windowed = decode_step_seconds(args.window, context, args.batch, args.repeats) * 1e3
        paged_full = paged_attention_seconds(None, context, args.batch, args.repeats) * 1e3
        paged_windowed = paged_attention_seconds(args.window, context, args.batch, args.repeats) * 1e3
        print(f"{context:>8} | {full:>15.3f} {windowed:>9.3f} {full / windowed:>6.2f} | "
              f"{paged_full:>15.3f} {paged_windowed:>9.3f} {paged_full / paged_windowed:>6.2f}")


if __name__ == "__main__":
    main()
