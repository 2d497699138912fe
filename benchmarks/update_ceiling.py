"""How far the bench's update is from the matmul peak, and why: its utilisation split in three.

    uv run python benchmarks/update_ceiling.py [--preset tiny-qwen2] [--repeats 20]

`trainer bench` reports the update's model FLOPs per second as a fraction of the machine's
float32 matmul peak (n x n matmuls of 512-2048). This takes the update the bench runs (same
preset, model, batch and AdamW; the batch of its second step) and prints, as ratios:

  real share      real token positions / the positions the update computes (prompt padding
                  and the completion columns past a row's end are computed but not counted; a
                  prompt its group shares, once per group)
  dense program   the update's block matmuls alone (q, k, v, o, gate, up, down of every layer;
                  forward and both backward products) at the update's padded shape, one
                  jitted program, as a fraction of the peak: what matmuls of these shapes reach
                  (the last block's query side only on the rows the update reads)
  update          the learner's own update (median of --repeats), needed FLOPs as the bench
                  counts them (what the update runs), as a fraction of the peak
  ceiling         real share x dense program: the update's utilisation if it ran only its
                  matmuls, at the dense program's rate

The update's utilisation is at most that ceiling: the elementwise work
(norms, SwiGLU, rotary, softmax, the loss, AdamW) only lowers it, so the ratio of the update
to the ceiling is how much of the update's time its matmuls would need at that rate.

Then, from a profile of 10 updates (jax.profiler), the CPU threads' time by kind of XLA
operation: library fusions (XNNPACK/YNNPACK: the block matmuls, with what XLA fused into
them), XLA's own dots (the attention's small batched matmuls), and every other fusion
(elementwise and copies), each as a share of the threads' busy time and with the part of it
one thread worked while the others had nothing to run.
"""

import argparse
import bisect
import collections
import re
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.profiler import ProfileData
from rl_core.runtime import keep_freed_memory, unroll_threefry_on_cpu
from rl_core.train import trim_example, trimmed_width
from trainer import build
from trainer.bench import measure as bench
from trainer.bench.flops import block_matmul_weights, matmul_peak, query_side_weights, scored_tokens, training_flops
from trainer.bench.presets import PRESETS
from timing import times


def dense_program(cfg, rows: int, last_rows: int):
    """fwd + bwd of every block matmul at [rows, D], the last block's query side (q, o, MLP) at
    [last_rows, D] as the update runs it; returns (jitted grad fn, its args, its FLOPs)."""
    d, h, k, dh, f = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_hidden_size
    shapes = [(d, h * dh), (d, k * dh), (d, k * dh), (h * dh, d), (d, f), (d, f), (f, d)]
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 1 + len(shapes) * cfg.num_layers))
    weights = [[jax.random.normal(next(keys), s, jnp.float32) / s[0] ** 0.5 for s in shapes]
               for _ in range(cfg.num_layers)]
    x = jax.random.normal(next(keys), (rows, d), jnp.float32)

    def loss(weights, x):
        for i, (wq, wk, wv, wo, wg, wu, wd) in enumerate(weights):
            kk, v = x @ wk, x @ wv
            x = x[rows - last_rows :] if i == len(weights) - 1 else x
            # k and v enter through the attention output (a sum keeps them in the program, no matmul)
            attn = x @ wq + jnp.tile(kk + v, (1, h // k))[rows - x.shape[0] :]
            x = x + attn @ wo + (x @ wg + x @ wu) @ wd
        return jnp.sum(x)

    grad = jax.jit(jax.grad(loss))
    # forward 2WN, backward 4WN; the last block's q, o and MLP on last_rows
    flops = 6.0 * (block_matmul_weights(cfg) * rows - query_side_weights(cfg) * (rows - last_rows))
    return grad, (weights, x), flops


def seconds(fn, repeats: int) -> tuple[float, float]:
    """(median, best) seconds of `fn` over `repeats` runs after one untimed run."""
    runs = times(fn, repeats)
    return float(np.median(runs)), float(min(runs))


def thread_time_by_kind(fn, runs: int = 10) -> tuple[dict[str, tuple[float, float]], int, float]:
    """From a profile of `runs` runs: per kind of operation, the milliseconds per run XLA's CPU
    threads spent in it and the part of those with no other thread at work; the number of
    threads; and the wall milliseconds per run."""
    folder = tempfile.mkdtemp()
    jax.profiler.start_trace(folder)
    start = time.perf_counter()
    for _ in range(runs):
        jax.block_until_ready(fn())
    wall = (time.perf_counter() - start) * 1e3 / runs
    jax.profiler.stop_trace()
    data = ProfileData.from_file(str(max(Path(folder).rglob("*.xplane.pb"))))
    threads = []  # per XLA intra-op thread: (start, end, kind) of each operation it ran
    for plane in data.planes:
        for line in plane.lines:
            if "Eigen" not in line.name:
                continue
            events = []
            for event in line.events:
                name = re.sub(r"[.\d]+$", "", event.name)
                if name.startswith(("ThunkExecutor", "SlinkyThreadPool", "end:")):
                    continue
                kind = ("library fusions (matmuls)" if name.startswith(("ynn_", "xnn_")) else
                        "XLA dots" if name in ("dot", "dot_general") else "other fusions and copies")
                events.append((event.start_ns, event.start_ns + event.duration_ns, kind))
            threads.append(sorted(events))
    busy, alone = collections.Counter(), collections.Counter()
    for i, events in enumerate(threads):
        others = [other for j, other in enumerate(threads) if j != i]
        for a, b, kind in events:
            # one thread's operations never overlap: look back from the last one starting before b
            shared = 0
            for other in others:
                k = bisect.bisect_left(other, (b,)) - 1
                while k >= 0 and other[k][1] > a:
                    shared += min(b, other[k][1]) - max(a, other[k][0])
                    k -= 1
            busy[kind] += (b - a) / 1e6 / runs
            alone[kind] += max(0, b - a - shared) / 1e6 / runs  # a lower bound with three or more threads
    return {kind: (busy[kind], alone[kind]) for kind in busy}, len(threads), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny-qwen2", choices=sorted(PRESETS))
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    keep_freed_memory()
    unroll_threefry_on_cpu()
    p = PRESETS[args.preset]
    settings = bench.bench_settings(p, steps=2)
    tokenizer = build.tokenizer(settings)
    learner = build.learner(settings, settings.task.build(), tokenizer, build.new_model(settings, tokenizer),
                            output_dir=None, progress=False)
    update = learner.update_models
    learner.train_step()  # compiles
    prompts, _ = learner.supply().draw(learner.training.prompts_per_step)
    example = learner.produce_examples(prompts).example  # the second step's batch (nothing patched)
    cfg = learner.model.config
    peak = matmul_peak(p.matmul_sizes, p.matmul_repeats, p.matmul_min_seconds)["flops_per_sec"]

    trimmed = trim_example(example, trimmed_width(example.completion_mask, learner.rollout.logprob_chunk_tokens))
    prompt, completion = bench.example_tokens(trimmed)
    p_width, t_width = trimmed.prompt_tokens.shape[1], trimmed.completion_tokens.shape[1]
    rows = trimmed.prompt_tokens.shape[0]
    group = learner.layout.rows_per_prompt(trimmed.prompt_tokens, trimmed.prompt_mask)
    # fed in: each prompt (once per group when shared) and the completions but their last token;
    # the last block's queries from each prompt's last token on
    prompt_rows = rows // group
    positions = prompt_rows * p_width + rows * (t_width - 1)
    real = scored_tokens(prompt, completion).sum() - (1 - 1 / group) * prompt.sum()
    real_share = float(real) / positions
    grad, dense_args, dense_flops = dense_program(cfg, positions, prompt_rows + rows * (t_width - 1))
    dense_median, dense_best = seconds(lambda: grad(*dense_args), args.repeats)
    update_median, update_best = seconds(lambda: update(example), args.repeats)
    update_flops = training_flops(cfg, prompt, completion, group)

    fed = f"{prompt_rows} prompts x {p_width} + {rows} rows x {t_width - 1}" if group > 1 else \
        f"{rows} rows x {p_width + t_width - 1}"
    print(f"{args.preset}: the update computes {fed} positions; matmul peak {peak / 1e9:.0f} GFLOP/s")
    print(f"real share     {real_share:.1%} of those positions are real tokens")
    print(f"dense program  {dense_flops / dense_best / peak:.1%} of the peak (best; median "
          f"{dense_flops / dense_median / peak:.1%}), {dense_best * 1e3:.1f} ms")
    print(f"update         {update_flops / update_best / peak:.1%} of the peak (best; median "
          f"{update_flops / update_median / peak:.1%}), {update_best * 1e3:.1f} ms")
    ceiling = real_share * dense_flops / dense_best / peak
    print(f"ceiling        real share x dense program = {ceiling:.1%}; the update reaches "
          f"{update_flops / update_best / peak / ceiling:.0%} of it")
    kinds, threads, wall = thread_time_by_kind(lambda: update(example))
    busy = sum(ms for ms, _ in kinds.values())
    print(f"threads        {threads} busy {busy / (threads * wall):.0%} of a profiled update's {wall:.1f} ms; of their "
          "busy time: " + "; ".join(f"{kind} {ms / busy:.0%} ({solo / ms:.0%} of it with the other threads idle)"
                                   for kind, (ms, solo) in sorted(kinds.items(), key=lambda kv: -kv[1][0])))


if __name__ == "__main__":
    main()
