"""The Qwen2.5-0.5B shape with seeded random weights (float32): greedy tokens of both engines on
this host, saved, or compared with another host's saved tokens (a CPU's against a TPU's).

    python benchmarks/greedy_across_hosts.py --save tokens-cpu.npz
    python benchmarks/greedy_across_hosts.py --against tokens-cpu.npz   # on the other host

Both engines run at `highest` matmul precision (a TPU's float32 products are otherwise bf16 passes).
Prints, for each engine, the rows whose tokens equal the other host's and, for each row that
differs, the first new token where it does: random weights give flat logits, so a near tie
can fall the other way where exp and log differ in the sixth digit.
"""

from __future__ import annotations

import argparse
import sys

import jax
import numpy as np
from flax import nnx

from rl_core import GREEDY, Sampler
from rl_core.rollout import EngineSettings, PagedBackend, Requests, StaticBackend
from rl_models import PAGED_TRANSFORMER, Transformer, preset

VOCAB = 151936  # Qwen2.5's


def greedy_tokens(rows: int, width: int, new: int) -> dict[str, np.ndarray]:
    config = preset("qwen2_0_5b_shape", vocab_size=VOCAB, dtype="float32")
    graphdef, state = nnx.split(Transformer(config, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(1)
    lengths = rng.integers(4, width + 1, size=rows)
    tokens = np.zeros((rows, width), np.int32)
    mask = np.zeros((rows, width), bool)
    for i, length in enumerate(lengths):  # left-padded prompts of mixed lengths
        tokens[i, width - length:] = rng.integers(2, VOCAB, size=length)
        mask[i, width - length:] = True
    requests = Requests(tokens, mask)
    static = StaticBackend(Sampler(graphdef, max_new_tokens=new, eos_ids=(1,), pad_id=0))
    paged = PagedBackend(graphdef, EngineSettings(max_prompt_tokens=width, max_new_tokens=new, slots=rows,
                                                  prefill_chunk=64, page_size=16),
                         paging=PAGED_TRANSFORMER, eos_ids=(1,), pad_id=0)
    out = {}
    with jax.default_matmul_precision("highest"):
        for name, engine in (("static", static), ("paged", paged)):
            engine.update_weights(state, 1)
            out[name] = np.asarray(engine.generate(requests, GREEDY, jax.random.key(0)).tokens)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--width", type=int, default=24, help="longest prompt")
    parser.add_argument("--new", type=int, default=32, help="new tokens a row")
    parser.add_argument("--save", help="write this host's tokens (.npz)")
    parser.add_argument("--against", help="another host's saved tokens to compare with")
    args = parser.parse_args()
    print(f"backend: {jax.default_backend()} ({jax.devices()[0].device_kind})")
    mine = greedy_tokens(args.rows, args.width, args.new)
    same = [i for i in range(args.rows) if np.array_equal(mine["static"][i], mine["paged"][i])]
    print(f"this host: paged vs static greedy tokens: {len(same)}/{args.rows} rows equal")
    if args.save:
        np.savez(args.save, **mine)
        print(f"wrote {args.save}")
    if args.against:
        theirs = np.load(args.against)
        for name in ("static", "paged"):
            a, b = mine[name], theirs[name]
            equal = [bool(np.array_equal(a[i], b[i])) for i in range(len(a))]
            first = {i: int(np.argmax(a[i] != b[i])) for i in range(len(a)) if not equal[i]}
            print(f"{name}: {sum(equal)}/{len(a)} rows equal to {args.against}; first differing token of the "
                  f"others: {first}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
