"""SmolLM2-135M-Instruct's rollout and update on this machine, each beside its floor.

    uv run python benchmarks/real_model_floors.py [--model DIR] [--new-tokens 64 512]
        [--engines static paged] [--update-tokens 64] [--repeats 2]

The batch is GRPO's: 4 prompts (the bench's 2-digit additions, 6-7 tokens in SmolLM2's tokenizer)
x 4 completions, float32 weights and compute (the `trainer bench` settings with `--model`).
`--model` is a Hugging Face folder; without it the GGUF of the `real-model` group is converted
into a temporary folder first (`trainer convert`, about 20 s).

Measured here, before the phases:
  bandwidth    memory read bandwidth: the best of a jitted sum of a 512 MiB float32 array and
               numpy's sum of it (GB/s, 1e9 bytes)
  matmul peak  `trainer bench`'s float32 matmul peak (trainer.bench.flops.matmul_peak)

Rollout: every completion runs to `--new-tokens` (the engines get an EOS id outside the
vocabulary, so none stops early and the step count is known), timed whole (prefill, decode,
host loop) after one untimed run that compiles; best of `--repeats`. Its floor:
  decode     for each decode step (new tokens - 1 of them: the prefill samples the first),
             the bytes it must read, every parameter once (float32; the tied embedding is
             read as the unembedding) plus the real KV cache of every row up to that step
             (K and V, float32, all layers), over the bandwidth: the memory floor. The
             roofline floor of a step is the larger of that and its FLOPs (2 x matmul
             weights x rows, the unembedding and the attention: trainer.bench.flops) over
             the matmul peak; on a CPU a 16-row step can be compute-bound.
  prefill    the larger of reading the weights once and the prefill's FLOPs over the peak.
The static engine's time is also split into prefill (the same program at 1 new token) and
decode per step, each beside its floor.

Update: the learner's own update (`update_models`, GRPO, AdamW) on a batch of the learner's
own rollout at `--update-tokens` new tokens with every completion token in the loss (the
mask made full: the shape a rollout that never stops early gives), median of `--repeats`
after one that compiles. Floor: its needed FLOPs (trainer.bench.flops.training_flops: forward
and backward of every matmul and the attention of the real tokens, each group's prompt once)
over the matmul peak. AdamW's memory traffic (about 7 float32 reads and writes per parameter)
is printed apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from rl_core.rollout import make_backend, Requests
from rl_core import SamplingParams
from rl_core.runtime import keep_freed_memory, unroll_threefry_on_cpu
from rl_models import PAGED_TRANSFORMER, TransformerConfig

from trainer import build
from trainer.bench.flops import forward_flops, matmul_peak, parameter_count, prefill_flops, training_flops
from trainer.bench.measure import bench_settings, example_tokens
from trainer.bench.presets import BenchPreset

PROMPTS, GROUP = 4, 4
MATMUL_SIZES = (512, 1024, 2048)


# -- the floors (pure arithmetic, tested in tests/trainer/test_trainer_bench.py) -------------------


def kv_bytes_per_token(cfg: TransformerConfig, dtype_bytes: int = 4) -> int:
    """Bytes of K and V one token position holds in the cache, all layers."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes


def decode_step_context(prompt_tokens: np.ndarray, group_size: int, new_tokens: int) -> np.ndarray:
    """[new_tokens - 1] real positions the rows' attention reads at each decode step: step k
    (1-based) feeds generated token k of every row, whose query reads the prompt and tokens 1..k."""
    total_prompt = float(np.sum(prompt_tokens)) * group_size
    rows = len(prompt_tokens) * group_size
    k = np.arange(1, new_tokens, dtype=np.float64)
    return total_prompt + rows * k


def decode_step_flops(cfg: TransformerConfig, prompt_tokens: np.ndarray, group_size: int,
                      new_tokens: int) -> np.ndarray:
    """[new_tokens - 1] FLOPs of each decode step (trainer.bench.flops' count: the blocks'
    matmuls, the attention over the cache and the unembedding, for every row)."""
    prompt = np.repeat(np.asarray(prompt_tokens), group_size)
    out = []
    for k in range(1, new_tokens):
        # position prompt + k of every row: a causal forward over prompt + k tokens less prompt + k - 1
        out.append(forward_flops(cfg, prompt + k, np.ones_like(prompt)) -
                   forward_flops(cfg, prompt + k - 1, np.zeros_like(prompt)))
    return np.asarray(out)


def rollout_floor(*, weight_bytes: float, kv_bytes: float, context: np.ndarray, step_flops: np.ndarray,
                  prefill_flops: float, bandwidth: float, peak: float) -> dict[str, float]:
    """Seconds: `memory` (each decode step reads the weights and the real KV cache of `context`
    positions, at `bandwidth` bytes/s), `roofline` (each step the larger of that and its FLOPs at
    `peak`), `prefill` (the larger of one weight read and `prefill_flops` at `peak`) and `total`
    (prefill + roofline)."""
    step_bytes = weight_bytes + kv_bytes * np.asarray(context, np.float64)
    memory = step_bytes / bandwidth
    compute = np.asarray(step_flops, np.float64) / peak
    prefill = max(weight_bytes / bandwidth, prefill_flops / peak)
    roofline = float(np.maximum(memory, compute).sum())
    return {"memory": float(memory.sum()), "compute": float(compute.sum()), "roofline": roofline,
            "prefill": prefill, "total": prefill + roofline, "steps": float(len(step_bytes))}


# -- measurements -----------------------------------------------------------------------------------


def best_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def read_bandwidth(mib: int = 512, repeats: int = 10) -> dict[str, float]:
    """Bytes/s of reading a `mib` MiB float32 array: a jitted sum and numpy's sum; `best` of them."""
    host = np.random.default_rng(0).standard_normal(mib * 2**18, dtype=np.float32)
    dev = jnp.asarray(host)
    total = jax.jit(jnp.sum)
    total(dev).block_until_ready()
    rates = {"jax_sum": host.nbytes / best_seconds(lambda: total(dev), repeats),
             "numpy_sum": host.nbytes / best_seconds(lambda: host.sum(), repeats)}
    return rates | {"best": max(rates.values())}


def converted_model() -> str:
    from rl_models.hf.from_gguf import convert_gguf, smollm2_gguf

    out = Path(tempfile.mkdtemp(prefix="smollm2-")) / "model"
    convert_gguf(smollm2_gguf(), out)
    return str(out)


def time_rollout(learner, engine: str, new_tokens: int, tokens, mask, repeats: int) -> float:
    cfg = learner.model.config
    rollout = dataclasses.replace(learner.rollout, engine=engine, max_new_tokens=new_tokens)
    # an EOS id no sample can take: every completion runs to new_tokens
    backend = make_backend(rollout, learner.policy.graphdef, eos_ids=(cfg.vocab_size,), pad_id=learner.tokenizer.pad_id,
                           batch_size=PROMPTS * GROUP, paging=PAGED_TRANSFORMER)
    backend.update_weights(learner.policy_params(), 0)
    requests = Requests(tokens, mask, GROUP)
    sampling = SamplingParams(temperature=1.0)
    run = lambda: backend.generate(requests, sampling, jax.random.key(1)).lengths  # noqa: E731
    lengths = np.asarray(jax.block_until_ready(run()))  # compiles
    assert (lengths == new_tokens).all(), lengths
    return best_seconds(run, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a converted SmolLM2 folder (default: convert the GGUF)")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--engines", nargs="+", default=["static", "paged"])
    parser.add_argument("--update-tokens", type=int, default=64, help="0: no update")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    keep_freed_memory()
    unroll_threefry_on_cpu()
    model = args.model or converted_model()

    preset = BenchPreset(model="tiny", prompts=PROMPTS, group_size=GROUP, max_new_tokens=args.update_tokens or 64)
    settings = bench_settings(preset, steps=1, model=model)
    tokenizer = build.tokenizer(settings)
    policy = build.new_model(settings, tokenizer)
    learner = build.learner(settings, settings.task.build(), tokenizer, policy, output_dir=None, progress=False)
    cfg = learner.model.config
    params = parameter_count(cfg)
    weight_bytes = 4.0 * params
    kv = kv_bytes_per_token(cfg)
    prompts, _ = learner.supply().draw(PROMPTS)
    tokens, mask = learner.generator.encode(prompts)
    prompt_len = mask.sum(axis=1)

    bw = read_bandwidth()
    peak = matmul_peak(MATMUL_SIZES, 5, 0.5)["flops_per_sec"]
    print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; model {model}: {params:,} parameters "
          f"({weight_bytes / 1e6:.0f} MB float32), KV {kv:,} B/token; {PROMPTS} prompts x {GROUP} completions, "
          f"prompts of {prompt_len.min()}-{prompt_len.max()} tokens (width {mask.shape[1]})")
    print(f"read bandwidth {bw['best'] / 1e9:.1f} GB/s (jax sum {bw['jax_sum'] / 1e9:.1f}, numpy sum "
          f"{bw['numpy_sum'] / 1e9:.1f}); float32 matmul peak {peak / 1e9:.1f} GFLOP/s")

    rows = []
    for new_tokens, engine in [(t, e) for t in args.new_tokens for e in args.engines]:
        floor = rollout_floor(weight_bytes=weight_bytes, kv_bytes=kv,
                              context=decode_step_context(prompt_len, GROUP, new_tokens),
                              step_flops=decode_step_flops(cfg, prompt_len, GROUP, new_tokens),
                              prefill_flops=prefill_flops(cfg, prompt_len), bandwidth=bw["best"], peak=peak)
        seconds = time_rollout(learner, engine, new_tokens, tokens, mask, 1 if new_tokens > 256 else args.repeats)
        rows.append((f"rollout {new_tokens} ({engine})", seconds, floor))
        print(f"rollout {new_tokens:>4} new tokens, {engine:>6}: {seconds:.2f} s; floor {floor['total']:.2f} s "
              f"(prefill {floor['prefill']:.2f} + {floor['steps']:.0f} decode steps: memory {floor['memory']:.2f}, "
              f"compute {floor['compute']:.2f}, roofline {floor['roofline']:.2f}); "
              f"ratio {seconds / floor['total']:.2f}x "
              f"(to the memory floor alone {seconds / (floor['prefill'] + floor['memory']):.2f}x)", flush=True)
        if engine == "static" and new_tokens == args.new_tokens[0] and new_tokens > 1:
            prefill = time_rollout(learner, "static", 1, tokens, mask, args.repeats)
            step = (seconds - prefill) / (new_tokens - 1)
            step_floor = floor["roofline"] / floor["steps"]
            print(f"  static split: prefill {prefill:.3f} s (floor {floor['prefill']:.3f}, "
                  f"{prefill / floor['prefill']:.1f}x); "
                  f"decode {step * 1e3:.1f} ms/step (roofline {step_floor * 1e3:.1f}, memory "
                  f"{floor['memory'] / floor['steps'] * 1e3:.1f}; {step / step_floor:.2f}x)", flush=True)

    if args.update_tokens:
        new_tokens = args.update_tokens
        example = learner.produce_examples(prompts).example
        full = jnp.ones((example.completion_mask.shape[0], new_tokens), example.completion_mask.dtype)
        width = example.completion_tokens.shape[1]
        assert width == new_tokens, (width, new_tokens)
        example = example._replace(completion_mask=full)
        prompt, completion = example_tokens(example)
        group = learner.layout.rows_per_prompt(example.prompt_tokens, example.prompt_mask)
        flops = training_flops(cfg, prompt, completion, group)
        jax.block_until_ready(learner.update_models(example))  # compiles
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            jax.block_until_ready(learner.update_models(example))
            times.append(time.perf_counter() - start)
        seconds = float(np.median(times))
        floor = flops / peak
        adamw = 7 * weight_bytes / bw["best"]
        rows.append((f"update {new_tokens} (GRPO, AdamW)", seconds, {"total": floor}))
        print(f"update {new_tokens:>4} new tokens: {seconds:.2f} s (best {min(times):.2f}); {flops / 1e12:.2f} TFLOP "
              f"needed, floor {floor:.2f} s at the peak; ratio {seconds / floor:.2f}x; AdamW's memory traffic "
              f"{adamw:.2f} s at the bandwidth", flush=True)

    print("\n| phase | measured s | floor s | ratio |\n|---|---:|---:|---:|")
    for name, seconds, floor in rows:
        print(f"| {name} | {seconds:.2f} | {floor['total']:.2f} | {seconds / floor['total']:.2f}x |")


if __name__ == "__main__":
    main()
