"""The mixture-of-experts MLP's time against its active and total parameters, and a decoding
step of a tiny MoE against a dense model of the same active size (rl_models.moe).

1. One MoE layer's forward over N = 512 tokens (D = 256, each expert F = 256, k = 2) for E = 2 ..
   32 experts, beside a dense gated MLP of the active width k * F: if the grouped matmuls follow the
   active parameters the time stays flat in E.
2. A decoding step (16 rows, a 64-slot cache) of a 4-layer model whose MLP is 16 experts of width
   64 with k = 2, against the same model with a dense MLP of width 128 (the same active size).

    uv run python benchmarks/moe_speed.py
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_models import Transformer, TransformerConfig
from rl_models.moe import MoE
from rl_models.block import MLP


def best_ms(fn, *args, repeats: int = 20) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return 1e3 * min(times)


def layer_times() -> None:
    x = jax.random.normal(jax.random.key(0), (4, 128, 256))
    base = dict(vocab_size=64, hidden_size=256, num_layers=1, num_heads=4, num_kv_heads=4)
    dense = MLP(TransformerConfig(**base, mlp_hidden_size=512), rngs=nnx.Rngs(0))
    print(f"dense MLP, width 512 (= k * F): {best_ms(jax.jit(lambda m: m(x)), dense):.2f} ms")
    for e in (2, 4, 8, 16, 32):
        config = TransformerConfig(**base, mlp_hidden_size=512, num_experts=e, experts_per_token=2, moe_hidden_size=256)
        moe = MoE(config, rngs=nnx.Rngs(0))
        total = 3 * e * 256 * 256
        print(f"MoE E={e:2d} k=2 F=256: {best_ms(jax.jit(lambda m: m(x)), moe):7.2f} ms  "
              f"(expert params {total / 1e6:.2f}M total, {3 * 2 * 256 * 256 / 1e6:.2f}M active per token)")


def decode_times() -> None:
    rows, slots = 16, 64
    shape = dict(vocab_size=512, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2)
    configs = {"dense, MLP width 128": TransformerConfig(**shape, mlp_hidden_size=128),
               "MoE, 16 experts of 64, k=2": TransformerConfig(**shape, mlp_hidden_size=128, num_experts=16,
                                                              experts_per_token=2, moe_hidden_size=64)}
    for name, config in configs.items():
        model = Transformer(config, rngs=nnx.Rngs(0))
        tokens = jnp.zeros((rows, 1), jnp.int32)
        mask = jnp.ones((rows, 1, slots), bool)

        @jax.jit
        def step(m, cache, t):
            hidden, cache = m(tokens, jnp.full((rows, 1), t), mask, cache, t)
            return jnp.argmax(m.logits(hidden[:, -1]), -1), cache

        cache = model.init_cache(rows, slots)
        ms = best_ms(lambda c: step(model, c, jnp.int32(8))[0], cache)
        params = sum(np.size(p) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
        print(f"{name:28s} decode step {ms:.2f} ms = {rows / ms * 1e3:,.0f} tokens/s ({params / 1e6:.2f}M params)")


if __name__ == "__main__":
    print(f"backend: {jax.default_backend()}")
    layer_times()
    decode_times()
