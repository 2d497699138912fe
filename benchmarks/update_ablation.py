"""What each part of the bench's update costs: the part taken out, the update compiled again.

    uv run python benchmarks/update_ablation.py [--preset tiny-qwen2] [--rounds 40] [PART ...]

Takes the update `trainer bench` runs (same preset, model, batch and optimizer; the batch of
its third step) and, for each PART, compiles it again with that part of the model replaced by
something almost free, then runs the default and every variant alternately on the same batch,
each on its own copy of the state, in one process (the machine's drift cancels). Prints each
variant's median time and its median ratio to the default round by round: what removing the
part would save, an upper bound on what making it faster can. The variants compute something
else (no model trains like that); they exist only to be timed.

  attention   the attention core (scores, softmax, both products) replaced by q + k + v
  rope        the rotary embedding replaced by the identity
  norm        every RMSNorm replaced by its weight times x
  silu        SwiGLU's silu(gate) replaced by gate
  logprobs    the unembedding, log-softmax and gather replaced by a mean of the hidden state
  adamw       SGD instead of AdamW (the optimizer state is the only other difference)
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import rl_core.policy.logprobs as logprobs_lib
import rl_models.attention as attention_lib
import rl_models.block as block_lib
import rl_models.layers as layers_lib
from rl_core.runtime import keep_freed_memory, unroll_threefry_on_cpu
from rl_core.train import trim_example, trimmed_width
from trainer import build
from trainer.bench import measure as bench
from trainer.bench.presets import PRESETS


@contextlib.contextmanager
def replaced(owner: object, name: str, value: object) -> Iterator[None]:
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


@contextlib.contextmanager
def attention_replaced(value: object) -> Iterator[None]:
    """`attend` replaced where the model calls it: the block's cache path and, through
    `attend_sequence`, the kernels' module (rl_models.attention)."""
    with replaced(attention_lib, "attend", value), replaced(block_lib, "attend", value):
        yield


def _no_attention(q, k, v, mask):
    b, l, h, dh = q.shape
    kv = (k + v).transpose(0, 2, 1, 3)  # [B, S, K, Dh]: keeps the k and v projections in the program
    return (q + jnp.repeat(kv, h // k.shape[1], axis=2)).reshape(b, l, h * dh)


def _no_silu(mlp, x):
    return mlp.down_proj(mlp.gate_proj(x) * mlp.up_proj(x))


def _no_logprobs(model, hidden, targets, **_):
    return hidden.mean(-1), jnp.zeros(targets.shape, hidden.dtype)


PARTS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "attention": lambda: attention_replaced(_no_attention),
    "rope": lambda: replaced(block_lib, "rotate", lambda x, cos, sin: x),
    "norm": lambda: replaced(layers_lib.RMSNorm, "__call__", lambda norm, x: norm.weight[...] * x),
    "silu": lambda: replaced(block_lib.MLP, "__call__", _no_silu),
    "logprobs": lambda: replaced(logprobs_lib, "chunked_logprobs", _no_logprobs),
}
OPTIMIZER_PARTS = {"adamw": "training.optimizer=sgd"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", metavar="PART", help=f"of {', '.join([*PARTS, *OPTIMIZER_PARTS])} (default: all)")
    parser.add_argument("--preset", default="tiny-qwen2", choices=sorted(PRESETS))
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    unknown = sorted(set(args.parts) - {*PARTS, *OPTIMIZER_PARTS})
    if unknown:
        parser.error(f"unknown parts {unknown}; choose from {', '.join([*PARTS, *OPTIMIZER_PARTS])}")
    keep_freed_memory()
    unroll_threefry_on_cpu()
    p = PRESETS[args.preset]

    def learner(*overrides: str):
        settings = bench.bench_settings(p, steps=3, overrides=overrides)
        tokenizer = build.tokenizer(settings)
        return build.learner(settings, settings.task.build(), tokenizer, build.new_model(settings, tokenizer),
                             output_dir=None, progress=False)

    default = learner()
    for _ in range(2):
        default.train_step()
    prompts, _ = default.supply().draw(default.training.prompts_per_step)
    example = default.produce_examples(prompts).example  # the third step's batch (nothing patched)
    width = trimmed_width(example.completion_mask, default.rollout.logprob_chunk_tokens)
    batch = default.layout.mini_batches(trim_example(example, width))[0]
    part = default.models["policy"]
    state = default.state.models["policy"]
    programs = {"default": (part.update_step.lower(state, part.frozen, batch).compile(), state)}
    for name in args.parts or [*PARTS, *OPTIMIZER_PARTS]:
        if name in OPTIMIZER_PARTS:
            made = learner(OPTIMIZER_PARTS[name])
        else:
            with PARTS[name]():
                made = learner()
        other = made.models["policy"]
        state = jax.tree.map(jnp.copy, made.state.models["policy"])
        programs[name] = (other.update_step.lower(state, part.frozen, batch).compile(), state)

    times: dict[str, list[float]] = {name: [] for name in programs}
    states = {name: state for name, (_, state) in programs.items()}
    order = list(programs)
    for r in range(args.rounds + 2):
        for name in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            states[name], _ = programs[name][0](states[name], part.frozen, batch)
            jax.block_until_ready(states[name])
            if r >= 2:  # the first two rounds warm up
                times[name].append(time.perf_counter() - start)
    base = np.array(times["default"])
    print(f"{args.preset}: the update at {batch.prompt_tokens.shape[1]} rows x "
          f"{batch.prompt_tokens.shape[2] + batch.completion_tokens.shape[2]} positions, {args.rounds} rounds")
    for name, values in times.items():
        values = np.array(values)
        print(f"{'without ' + name if name != 'default' else 'default':20s} median {np.median(values) * 1e3:6.1f} ms"
              f"   ratio {np.median(values / base):.3f}")


if __name__ == "__main__":
    main()
