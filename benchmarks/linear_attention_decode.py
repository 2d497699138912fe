"""Decode time per token against context length: one Gated DeltaNet layer (Qwen3.5's linear
attention) versus one gated full-attention layer of the same width, each as the decode loop runs
it (one new token per row, jitted, its cache or state donated and threaded through).

The full-attention layer reads its whole KV cache every token, so its time grows with the
context; the linear-attention layer reads a fixed state (conv taps + a [Dk, Dv] matrix per value
head), so its time does not. Prints milliseconds per token (median of `--repeats` timed runs of
`--steps` tokens) and the ratio attention / linear at each context length, all measured in one run.

    uv run python benchmarks/linear_attention_decode.py --contexts 256 1024 4096 16384
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from rl_models import LinearAttention, TransformerConfig
from rl_models.gated_attention import GatedAttention
from rl_models.gated_deltanet import GatedDeltaNet
from rl_models.rope import rope_cos_sin, rope_inv_freq

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096, 16384])
parser.add_argument("--rows", type=int, default=8)
parser.add_argument("--hidden", type=int, default=1024)
parser.add_argument("--steps", type=int, default=16, help="tokens per timed run")
parser.add_argument("--repeats", type=int, default=5)
args = parser.parse_args()

# Qwen3.5-shaped at width D: attention 8 query heads of 256 over 2 KV heads (head_dim 256, as
# Qwen3.5 has), linear attention Hk = 4 key heads and Hv = 8 value heads of 128.
D = args.hidden
config = TransformerConfig(
    vocab_size=16, hidden_size=D, num_layers=2, num_heads=D // 128, num_kv_heads=2, head_dim=256,
    mlp_hidden_size=4 * D, qk_norm=True, attention_output_gate=True, partial_rotary_factor=0.25,
    layer_types=("linear_attention", "full_attention"),
    linear_attention=LinearAttention(num_key_heads=D // 256, num_value_heads=D // 128, key_head_dim=128,
                                     value_head_dim=128),
)
rngs = nnx.Rngs(0)
linear = GatedDeltaNet(config, dtype=jnp.float32, param_dtype=jnp.float32, rngs=rngs)
attention = GatedAttention(config, rngs=rngs)
b = args.rows
x = jax.random.normal(jax.random.key(1), (b, 1, D)) * 0.1
ones = jnp.ones((b, 1), bool)
inv_freq = rope_inv_freq(config.rotary_dim, config.rope_theta, None)


@jax.jit
def linear_steps(module, x, state):
    def body(state, _):
        out, state = module(x, ones, ~ones, state)
        return state, out[:, 0, 0]

    return jax.lax.scan(body, state, None, length=args.steps)


def attention_steps_for(context: int):
    @jax.jit
    def run(module, x, kv):
        def body(carry, t):
            kv = carry
            slot = context - args.steps + t  # the cache is full up to the slot written
            rope = rope_cos_sin(jnp.full((b, 1), slot), inv_freq)
            mask = (jnp.arange(context) <= slot)[None, None, :].repeat(b, 0)
            out, kv = module(x, rope, mask, kv, slot, jnp.int32(0))
            return kv, out[:, 0, 0]

        return jax.lax.scan(body, kv, jnp.arange(args.steps))

    return run


def per_token_ms(run, *inputs) -> float:
    jax.block_until_ready(run(*inputs))  # compile
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(*inputs))
        times.append((time.perf_counter() - start) / args.steps * 1e3)
    return statistics.median(times)


la = config.linear_attention
state = linear.init_state(b)
state_bytes = sum(a.size * a.dtype.itemsize for a in state)
lin_ms = per_token_ms(linear_steps, linear, x, state)
print(f"backend {jax.default_backend()}, {b} rows, D={D}; linear-attention state {state_bytes / 2**20:.2f} MiB "
      f"at any context; KV per token {2 * 2 * 256 * 4 * b / 2**10:.0f} KiB")
print(f"{'context':>8} {'attention ms/token':>19} {'linear ms/token':>16} {'attention/linear':>17}")
for context in args.contexts:
    kv = tuple(jax.random.normal(jax.random.key(2), (1, b, 2, context, 256)) * 0.1 for _ in "kv")
    att_ms = per_token_ms(attention_steps_for(context), attention, x, kv)
    # the linear layer's step is the same whatever the context: timed again beside each, one run
    lin_ms = per_token_ms(linear_steps, linear, x, state)
    print(f"{context:>8} {att_ms:>19.3f} {lin_ms:>16.3f} {att_ms / lin_ms:>17.2f}")
