"""The bench's update under other memory settings: remat, micro-batch and packing, timed on one batch.

    uv run python benchmarks/update_settings.py [--preset tiny-qwen2] [--rounds 5] SETTINGS [SETTINGS ...]

SETTINGS is one variant, its dotted keys joined by commas, e.g. `model.remat=full` or
`model.remat=none,training.micro_batch_size=8,training.packing=true`. The batch is the preset's
third step's (two `train_step`s of a first learner, at the first variant's settings, then one more
rollout); each variant then gets a learner of its own, built after the last one is freed (a 0.5B
model's float32 weights and AdamW take 4 GiB: two at once leave little on a 16 GiB chip), its update
compiled on that batch (a variant the compiler refuses prints its refusal and the next runs) and
timed `--rounds` times after one warm-up call. Prints each variant's median seconds and the
update's MFU as `trainer bench` counts it (model FLOPs of the real tokens, over the matmul peak given
with `--peak-tflops`): which default is fastest where it fits, measured rather than guessed.
"""

from __future__ import annotations

import argparse
import gc
import time

import jax
import numpy as np
from rl_core.runtime import keep_freed_memory, unroll_threefry_on_cpu
from rl_core.train import trim_example, trimmed_width
from trainer import build
from trainer.bench import measure as bench
from trainer.bench.presets import PRESETS


def learner(preset, overrides):
    settings = bench.bench_settings(preset, steps=3, overrides=overrides)
    tokenizer = build.tokenizer(settings)
    return build.learner(settings, settings.task.build(), tokenizer, build.new_model(settings, tokenizer),
                         output_dir=None, progress=False)


def third_batch(preset, overrides):
    """The example of the preset's third step, as host arrays."""
    first = learner(preset, overrides)
    for _ in range(2):
        first.train_step()
    prompts, _ = first.supply().draw(first.training.prompts_per_step)
    example = jax.device_get(first.produce_examples(prompts).example)
    del first
    gc.collect()
    return example


def time_variant(preset, overrides, example, rounds):
    made = learner(preset, overrides)
    width = trimmed_width(example.completion_mask, made.rollout.logprob_chunk_tokens)
    batches = made.layout.mini_batches(trim_example(example, width))
    part = made.models["policy"]
    state = made.state.models["policy"]
    try:
        program = part.update_step.lower(state, part.frozen, batches[0]).compile()
    except Exception as e:  # noqa: BLE001 - the compiler's refusal is this variant's answer
        return None, str(e).splitlines()[0][:200]
    times = []
    for r in range(rounds + 1):
        start = time.perf_counter()
        for batch in batches:
            state, _ = program(state, part.frozen, batch)
        jax.block_until_ready(state)
        if r:  # the first call warms up
            times.append(time.perf_counter() - start)
    del made, state, program, batches
    gc.collect()
    return float(np.median(times)), ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", metavar="SETTINGS")
    parser.add_argument("--preset", default="tiny-qwen2", choices=sorted(PRESETS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the matmul peak the MFU is of (default: print seconds only)")
    parser.add_argument("--model-tflop", type=float, default=None,
                        help="the update's model TFLOP on the batch, as trainer bench printed it")
    args = parser.parse_args()
    keep_freed_memory()
    unroll_threefry_on_cpu()
    p = PRESETS[args.preset]
    variants = [tuple(v.split(",")) for v in args.variants]
    example = third_batch(p, variants[0])
    real = int(np.asarray(example.completion_mask).sum())
    print(f"{args.preset}: {np.shape(example.completion_mask)[0]} rows, {real} real completion tokens "
          f"of {np.size(example.completion_mask)} positions", flush=True)
    for overrides in variants:
        seconds, refused = time_variant(p, overrides, example, args.rounds)
        label = ",".join(overrides)
        if seconds is None:
            print(f"{label:70s} refused: {refused}", flush=True)
            continue
        mfu = ""
        if args.peak_tflops and args.model_tflop:
            mfu = f"   MFU {args.model_tflop / seconds / args.peak_tflops:.1%}"
        print(f"{label:70s} {seconds:8.4f} s{mfu}", flush=True)


if __name__ == "__main__":
    main()
