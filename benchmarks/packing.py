"""The policy's update pass on padded and on packed rows, for a long-tailed batch.

    uv run python benchmarks/packing.py [--rows 64] [--micro 16] [--max-new 512] [--repeats 5]

The tiny-qwen2 shape (D=128, 4 layers, random weights, character vocabulary); prompts
of 8 to 40 tokens, completions whose lengths follow a long tail (exponential, mean
max_new / 8, at most max_new), as RL responses do where a few run to the limit. One
jitted program per layout computes GRPO's gradients (log-probs of every completion
token, summed over micro-batches as the learner's update does). Prints, per layout,
the token positions computed (rows x width; rl_core.train.packing), the share that is
padding, the best seconds of `--repeats` runs, and the ratio. In both layouts the
completion columns end at the longest completion (the most rl_core.train.trim can cut).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from rl_core import completion_logprobs
from rl_core.train import pack_micro_batches, padded_positions
from rl_models import CharTokenizer, Transformer, TransformerConfig


def batch(rows: int, max_new: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    vocab = CharTokenizer().vocab_size
    p = 40
    prompt_len = rng.integers(8, p + 1, rows)
    new = np.minimum(np.ceil(rng.exponential(max_new / 8, rows)), max_new).astype(int)
    width = int(new.max())
    prompt_mask = (np.arange(p)[None] >= p - prompt_len[:, None]).astype(np.float32)
    mask = (np.arange(width)[None] < new[:, None]).astype(np.float32)
    prompt = np.where(prompt_mask > 0, rng.integers(3, vocab, (rows, p)), 0).astype(np.int32)
    completion = rng.integers(3, vocab, (rows, width)).astype(np.int32)
    return prompt, prompt_mask, completion, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--max-new", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    graphdef, params = nnx.split(Transformer(TransformerConfig.tiny_qwen2(CharTokenizer().vocab_size),
                                             rngs=nnx.Rngs(0)))
    prompt, prompt_mask, completion, mask = batch(args.rows, args.max_new)
    m = args.rows // args.micro
    stack = lambda x: x.reshape(m, args.micro, *x.shape[1:])  # noqa: E731
    fields = tuple(map(stack, (prompt, prompt_mask, completion, mask)))
    packed = pack_micro_batches(*fields, shards=1)
    adv = jnp.asarray(np.random.default_rng(1).normal(size=(m, args.micro)), jnp.float32)

    def grads(params, xs, packed):
        def micro_loss(params, x):
            (pt, pm, ct, mk, a), pk = x
            logp, _ = completion_logprobs(nnx.merge(graphdef, params), pt, pm, ct, packed=pk)
            return jnp.sum(-a[:, None] * logp * mk)

        def body(acc, x):
            g = jax.grad(micro_loss)(params, x)
            return jax.tree.map(jnp.add, acc, g), None

        return jax.lax.scan(body, jax.tree.map(jnp.zeros_like, params), ((*xs, adv), packed))[0]

    program = jax.jit(grads)
    seconds = {}
    real = int(prompt_mask.sum() + mask.sum())
    for name, pk in (("padded", None), ("packed", packed)):
        jax.block_until_ready(program(params, fields, pk))  # compile
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            jax.block_until_ready(program(params, fields, pk))
            best = min(best, time.perf_counter() - start)
        seconds[name] = best
        positions = (prompt.shape[1] + completion.shape[1]) * args.rows if pk is None else packed.tokens.size
        pad = positions - real if pk is None else padded_positions(packed)
        print(f"{name}: {positions:7d} positions ({pad / positions:5.1%} padding), {best * 1e3:8.1f} ms")
    print(f"packed / padded time: {seconds['packed'] / seconds['padded']:.2f}; real tokens {real}, "
          f"longest completion {int(mask.sum(1).max())}, mean {mask.sum(1).mean():.0f}")


if __name__ == "__main__":
    main()
