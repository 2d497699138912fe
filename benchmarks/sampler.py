"""Sampler throughput for a small model: generated tokens/s, prefill and decode time, compiled programs.

    uv run python benchmarks/sampler.py [--batch 64] [--prompt-tokens 16] [--new-tokens 32] [--repeats 5]

Model: D=128, 4 layers, 4 query / 2 KV heads, SwiGLU 512, character vocabulary
(99 ids), float32, random weights. Prefill is timed by a jitted prefill-only
program (cache init + prompt forward + first-token logits); decode time is
generate minus prefill. EOS is an id the model cannot emit, so every row
decodes all `--new-tokens` tokens and the work per call is fixed. Times are
medians over `--repeats` calls after one warm-up call; the compile count is
the number of XLA programs compiled for warm-up and for the timed calls
(which should add none).
"""

from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_core.runtime import compile_count, keep_freed_memory, unroll_threefry_on_cpu
from rl_core import Sampler, SamplingParams
from rl_core.policy import left_pad
from rl_models import CharTokenizer, Transformer, TransformerConfig
from timing import times


def model_config(vocab_size: int) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=vocab_size, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, mlp_hidden_size=512
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    keep_freed_memory()  # as the trainer does
    unroll_threefry_on_cpu()  # as the trainer does

    compile_count()  # start counting before anything compiles
    tokenizer = CharTokenizer()
    # an id outside the vocabulary: never sampled, so no row stops early
    never = tokenizer.vocab_size
    config = model_config(tokenizer.vocab_size)
    model = Transformer(config, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)

    rng = np.random.default_rng(0)
    lengths = rng.integers(args.prompt_tokens // 2, args.prompt_tokens + 1, args.batch)
    lengths[0] = args.prompt_tokens
    ids = [rng.integers(3, tokenizer.vocab_size, n).tolist() for n in lengths]
    prompt_tokens, prompt_mask = left_pad(ids, pad_id=tokenizer.pad_id, max_tokens=args.prompt_tokens)
    prompt_tokens, prompt_mask = jnp.asarray(prompt_tokens), jnp.asarray(prompt_mask)
    params = SamplingParams(temperature=args.temperature)
    key = jax.random.key(0)

    sampler = Sampler(graphdef, max_new_tokens=args.new_tokens, eos_ids=(never,), pad_id=tokenizer.pad_id)

    @jax.jit
    def prefill(state, tokens, mask):
        """What generate does before its decode loop: cache, prompt forward, first-token logits."""
        m = nnx.merge(graphdef, state)
        b, p = tokens.shape
        slots = p + args.new_tokens
        valid = mask > 0
        positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0).astype(jnp.int32)
        slot_valid = jnp.concatenate([valid, jnp.ones((b, args.new_tokens), bool)], axis=1)
        causal = jnp.arange(slots)[None, :] <= jnp.arange(p)[:, None]
        hidden, cache = m(tokens, positions, causal[None] & slot_valid[:, None, :], m.init_cache(b, slots), 0)
        return m.logits(hidden[:, -1]), cache

    before = compile_count()
    out = sampler(state, prompt_tokens, prompt_mask, key, params)
    jax.block_until_ready(out)
    jax.block_until_ready(prefill(state, prompt_tokens, prompt_mask))
    warmup_compiles = compile_count() - before

    before = compile_count()
    generate_s = statistics.median(times(lambda: sampler(state, prompt_tokens, prompt_mask, key, params), args.repeats,
                                         warm=False))
    prefill_s = statistics.median(times(lambda: prefill(state, prompt_tokens, prompt_mask), args.repeats, warm=False))
    timed_compiles = compile_count() - before

    generated = int(np.asarray(out.lengths).sum())
    decode_s = generate_s - prefill_s
    decode_steps = args.new_tokens - 1  # the first token comes from prefill
    print(
        f"model: D={config.hidden_size} layers={config.num_layers} heads={config.num_heads}/{config.num_kv_heads} "
        f"mlp={config.mlp_hidden_size} vocab={config.vocab_size} float32, "
        f"{sum(x.size for x in jax.tree.leaves(state)) / 1e6:.2f}M params"
    )
    print(
        f"batch={args.batch} prompt bucket={prompt_tokens.shape[1]} tokens new_tokens={args.new_tokens} "
        f"temperature={args.temperature} device={jax.devices()[0].platform} x{jax.device_count()}"
    )
    print(f"generated tokens/s: {generated / generate_s:,.0f}  ({generated} tokens in {generate_s * 1e3:.1f} ms)")
    print(f"prefill ms:         {prefill_s * 1e3:.2f}")
    per_step_ms = decode_s / decode_steps * 1e3
    print(f"decode ms:          {decode_s * 1e3:.2f}  ({per_step_ms:.3f} ms per step of {args.batch} rows)")
    print(
        f"compiled programs:  {warmup_compiles} at warm-up (sampler programs traced: {sampler.compiles}; "
        f"prefill-only: 1), {timed_compiles} during {2 * args.repeats} timed calls"
    )


if __name__ == "__main__":
    main()
