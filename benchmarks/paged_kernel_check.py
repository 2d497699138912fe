"""On a TPU: the paged engine's Pallas attention against plain attention, and its greedy tokens
against the static engine's, for the head dims models use.

    python benchmarks/paged_kernel_check.py

1. Attention: `RaggedKV` over its combined lane-packed pool (rl_core.rollout.ragged), layer 1 of 2,
   against a dense masked softmax of the same pages (float64 here), in float32 under `highest`
   matmul precision (XLA's attention over the pool) and in bfloat16 (JAX's ragged_paged_attention kernel), for (query heads, kv heads,
   head dim) of Qwen2.5-0.5B (14, 2, 64), SmolLM2 (9, 3, 64), Llama (8, 2, 128), Gemma (4, 2, 256),
   and 80 / 96 (zero-padded lanes). Prints the largest absolute difference of each.
2. Engines: a random float32 model with 64-dim heads (7 query heads on each of 2 kv heads),
   greedy, 16 prompts of mixed lengths: the paged engine's tokens equal the static engine's.
On a CPU host no Pallas interpreter runs the kernel (JAX 0.10.2): its bfloat16 line is the kernel's own
reference (`ref_ragged_paged_attention`) of the same inputs.
"""

from __future__ import annotations

import contextlib
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental.pallas import tpu as pltpu

from rl_core import GREEDY, Sampler
from rl_core.rollout import (EngineSettings, PagedBackend, RaggedKV, Requests, StaticBackend, combined_slots, pack_heads,
                             ragged_layout, ragged_tpu, wide)
from rl_models import PAGED_TRANSFORMER, Transformer, TransformerConfig

SHAPES = [(14, 2, 64), (9, 3, 64), (8, 2, 128), (4, 2, 256), (8, 8, 80), (12, 4, 96)]


def attention_error(heads: int, kv_heads: int, head_dim: int, dtype: str, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    n, pages, ps, m = 32, 160, 16, 8
    q = rng.normal(size=(n, heads, head_dim)).astype(np.float32)
    k, v = (rng.normal(size=(kv_heads, pages, ps, head_dim)).astype(np.float32) for _ in range(2))
    rows = np.stack([rng.permutation(np.arange(1, pages))[:m] for _ in range(n)]).astype(np.int32)
    lengths = rng.integers(1, m * ps + 1, size=n).astype(np.int32)
    pack, lanes, groups = ragged_layout(kv_heads, head_dim)
    slots = lambda x: jnp.asarray(x).transpose(1, 2, 0, 3).reshape(pages * ps, kv_heads, head_dim)  # noqa: E731
    on_tpu = jax.default_backend() == "tpu"
    kv = RaggedKV(ps, 4)
    if wide(kv_heads, head_dim):  # heads over 128 lanes: JAX's paged_attention over PallasKV's two pools
        two = [pack_heads(slots(x), pack, lanes).reshape(pages, ps, -1, lanes).transpose(2, 0, 1, 3)[None]
               for x in (k, v)]
        two = [jnp.concatenate([jnp.zeros_like(p), p]).astype(dtype) for p in two]
        interpret = contextlib.nullcontext() if on_tpu or dtype == "float32" else pltpu.force_tpu_interpret_mode()
        with jax.default_matmul_precision("highest"), interpret:
            got = jax.jit(lambda *a: kv.paged().attend(*a, None, None, kv_heads=kv_heads))(
                jnp.asarray(q, dtype), *two, 1, rows, lengths)
        return _error(q, k, v, rows, lengths, got)
    pool = combined_slots(slots(k), slots(v), pack, lanes, groups).reshape(1, pages, ps * 2 * groups, lanes)
    pool = jnp.concatenate([jnp.zeros_like(pool), pool]).astype(dtype)  # layer 1 of 2: page ids offset by a layer
    with jax.default_matmul_precision("highest"):
        if on_tpu or dtype == "float32":
            got = jax.jit(lambda *a: kv.attend(*a, None, None, kv_heads=kv_heads))(
                jnp.asarray(q, dtype), pool, 1, rows, lengths)
        else:  # no interpreter runs the kernel: its own reference, of the same inputs
            got = ragged_tpu(jnp.asarray(q, dtype), pool, 1, rows, lengths, kv_heads=kv_heads, pages_per_block=4,
                             as_its_reference=True)
    return _error(q, k, v, rows, lengths, got)


def _error(q, k, v, rows, lengths, got) -> float:
    """Largest |got - a float64 masked softmax of the same pages|."""
    n, heads, head_dim = q.shape
    kv_heads, m, ps = k.shape[0], rows.shape[1], k.shape[2]
    kk = k[:, rows].reshape(kv_heads, n, m * ps, head_dim)
    vv = v[:, rows].reshape(kv_heads, n, m * ps, head_dim)
    s = np.einsum("nkgd,knsd->nkgs", q.reshape(n, kv_heads, heads // kv_heads, head_dim).astype(np.float64), kk)
    s = np.where((np.arange(m * ps)[None, :] < lengths[:, None])[:, None, None], s / math.sqrt(head_dim), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("nkgs,knsd->nkgd", p / p.sum(-1, keepdims=True), vv).reshape(n, heads, head_dim)
    return float(np.abs(np.asarray(got, np.float64) - want).max())


def engines_agree() -> tuple[int, int]:
    """(rows whose greedy tokens are equal on both engines, rows)."""
    config = TransformerConfig.tiny(256, hidden_size=256, num_layers=2, num_heads=14, num_kv_heads=2, head_dim=64,
                                    mlp_hidden_size=512)
    model = Transformer(config, rngs=nnx.Rngs(3))
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(1)
    rows, width, new = 16, 40, 48
    lengths = rng.integers(3, width + 1, size=rows)
    tokens = np.zeros((rows, width), np.int32)
    mask = np.zeros((rows, width), bool)
    for i, length in enumerate(lengths):  # left-padded prompts of mixed lengths
        tokens[i, width - length:] = rng.integers(2, 256, size=length)
        mask[i, width - length:] = True
    requests = Requests(tokens, mask)
    greedy = GREEDY
    static = StaticBackend(Sampler(graphdef, max_new_tokens=new, eos_ids=(1,), pad_id=0))
    static.update_weights(state, 1)
    paged = PagedBackend(graphdef, EngineSettings(max_prompt_tokens=width, max_new_tokens=new, slots=16,
                                                  prefill_chunk=64, page_size=16),
                         paging=PAGED_TRANSFORMER, eos_ids=(1,), pad_id=0)
    paged.update_weights(state, 1)
    assert isinstance(paged.kv, RaggedKV) or jax.default_backend() != "tpu"
    with jax.default_matmul_precision("highest"):
        a = static.generate(requests, greedy, jax.random.key(0))
        b = paged.generate(requests, greedy, jax.random.key(0))
    same = sum(bool(np.array_equal(np.asarray(a.tokens)[i], np.asarray(b.tokens)[i])) for i in range(rows))
    return same, rows


def main() -> int:
    print(f"backend: {jax.default_backend()} ({jax.devices()[0].device_kind})")
    worst = worst_low = 0.0
    for shape in SHAPES:
        error = attention_error(*shape, "float32")
        worst = max(worst, error)
        low = attention_error(*shape, "bfloat16")  # the Pallas kernel (float32 pools take XLA's attention)
        worst_low = max(worst_low, low)
        print(f"paged attention {shape} (query heads, kv heads, head dim): max |paged - dense| = {error:.2e} "
              f"(float32), {low:.2e} (bfloat16 pool and queries: the ragged kernel)")
    same, rows = engines_agree()
    print(f"greedy tokens, paged engine vs static engine (float32, head dim 64): {same}/{rows} rows equal")
    return 0 if worst < 1e-4 and worst_low < 5e-2 and same == rows else 1


if __name__ == "__main__":
    sys.exit(main())
