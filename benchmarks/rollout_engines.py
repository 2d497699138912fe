"""The static sampler and the paged engine on the same requests: generated tokens/s of each.

    uv run python benchmarks/rollout_engines.py [--prompts 64] [--samples 8] [--new-tokens 256 1024 4096]
        [--model DIR] [--mean-fraction 0.2] [--profile DIR] [--decode-attention live masked]

Model: the sampler benchmark's (D=128, 4 layers, 4 query / 2 KV heads, SwiGLU
512, character vocabulary, float32, random weights), with an EOS schedule:
completion lengths follow a lognormal (sigma 1, mean 20% of max_new_tokens,
cut at the maximum), the long tail RL rollouts have (`--mean-fraction 0`: every completion runs
to the maximum). `--model DIR` runs a Hugging Face folder's model instead (its config and weights,
e.g. SmolLM2-135M converted by `trainer convert --gguf`; EOS its last vocabulary id), with the
same schedule; random prompt tokens either way. The schedule is forced
through the model's own output: the last hidden channel carries the position,
and the logits give EOS exactly the lognormal's hazard at that completion step
(every prompt has the same length, so position = prompt + step; in bfloat16 the
channel rounds positions past 256, coarsening the schedule alike for both engines). Sampling at
temperature 1 with each engine's keys, so the realized lengths differ between
engines but come from one distribution (their means are printed).

Each engine runs once at the measured shapes with a hazard of 1 (every
completion ends at its first token: compiles everything, costs nothing), then
the timed rollout. Tokens/s counts generated tokens (EOS included) over the
wall time of the whole rollout (prefill, decode, host loop); tokens/cpu-s over
the process's CPU time, which other processes on a shared core do not inflate
(the ratio is taken on it). `ms/step` is the rollout's seconds over its longest completion (prefill
included) and `floor` the time to read, once per step, the weights as the engine holds them and the
mean live KV cache at the device's HBM bandwidth (`HBM_BYTES_PER_SEC`; blank for other devices).
`--decode-attention live masked` runs the static engine once per decode attention on an accelerator
(rl_models.attention.DECODE_ATTENTION: "lanes", the default, heads of under 128 lanes cached side by side;
"masked", the heads' layout over every slot; "live", the live blocks read in place).
"""

from __future__ import annotations

import argparse
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_core.runtime import compile_count, keep_freed_memory, unroll_threefry_on_cpu
from rl_core.rollout import EngineSettings, PagedBackend, Requests, StaticBackend
from rl_core.rollout import attention as attention_lib
from rl_core import Sampler, SamplingParams
from rl_models import CharTokenizer, Transformer, TransformerConfig, TransformerPaging, preset
from rl_models import attention as attention_lib_models
from rl_models.hf import load_hf_config, load_hf_model
from trainer.bench.trace import profiled, summarise

PROMPT_TOKENS = 32
SIGMA = 1.0
HBM_BYTES_PER_SEC = {"TPU v5 lite": 819e9, "TPU v5e": 819e9, "TPU v6 lite": 1640e9, "TPU v4": 1228e9}
"""Nominal HBM bandwidth per device kind (Google's figures), for the decode floor."""


def decode_floor_ms(config: TransformerConfig, rows: int, mean_length: float) -> float | None:
    """Milliseconds to read the weights (in the compute dtype, as the sampler's loop holds them) and the
    mean live KV cache (prompt + half the mean completion, every layer's keys and values) once."""
    rate = HBM_BYTES_PER_SEC.get(jax.devices()[0].device_kind)
    if rate is None:
        return None
    size = jnp.dtype(config.dtype).itemsize
    model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    weights = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) * size
    per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * size
    live = rows * (PROMPT_TOKENS + mean_length / 2) * per_token
    return 1e3 * (weights + live) / rate


def lognormal_hazard(max_new_tokens: int, mean_fraction: float = 0.2) -> np.ndarray:
    """h[t] = P(length == t + 1 | length > t) for length = ceil(lognormal), cut at the maximum;
    mean_fraction 0: no EOS (every completion runs to the maximum)."""
    if mean_fraction <= 0:
        return np.zeros(max_new_tokens, np.float32)
    mu = math.log(mean_fraction * max_new_tokens) - SIGMA**2 / 2
    cdf = lambda x: 0.5 * (1 + math.erf((math.log(x) - mu) / (SIGMA * math.sqrt(2))))  # noqa: E731
    f = np.array([cdf(t) for t in range(1, max_new_tokens + 1)])
    before = np.concatenate([[0.0], f[:-1]])
    return np.clip((f - before) / np.maximum(1 - before, 1e-12), 0.0, 1.0).astype(np.float32)


def scheduled_model(config: TransformerConfig, eos: int, max_new_tokens: int) -> type[Transformer]:
    class Scheduled(Transformer):
        """A Transformer whose EOS probability at completion step t is hazard[t]."""

        def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
            super().__init__(config, rngs=rngs)
            self.hazard = nnx.Param(jnp.zeros((max_new_tokens,), jnp.float32))

        def __call__(self, tokens, positions, attention_mask, cache=None, cache_index=0, *, outputs_from=0):
            hidden, cache = super().__call__(tokens, positions, attention_mask, cache, cache_index,
                                             outputs_from=outputs_from)
            return hidden.at[..., -1].set(positions[:, outputs_from:].astype(hidden.dtype)), cache

        def logits(self, hidden):
            logits = super().logits(hidden)
            step = jnp.clip(hidden[..., -1].astype(jnp.int32) - (PROMPT_TOKENS - 1), 0, max_new_tokens - 1)
            h = jnp.clip(jnp.take(self.hazard[...], step), 1e-9, 1 - 1e-7)
            others = jax.nn.logsumexp(logits.at[..., eos].set(-jnp.inf), axis=-1)
            return logits.at[..., eos].set(others + jnp.log(h) - jnp.log1p(-h))  # P(eos) = h

    return Scheduled


class ScheduledPaging(TransformerPaging):
    """The paged engine's adapter for `scheduled_model`'s models: their positions in the hidden
    states' last feature, as their `__call__` puts them."""

    def forward(self, model, tokens, positions, pages, page_rows, kv):
        hidden, pages = super().forward(model, tokens, positions, pages, page_rows, kv)
        return hidden.at[..., -1].set(positions.astype(hidden.dtype)), pages


def run_one(backend, state, requests, hazard, sampling, profile=None) -> tuple[float, float, np.ndarray]:
    warm = dict(state)
    warm["hazard"] = jnp.ones_like(state["hazard"])
    backend.update_weights(warm, 0)
    jax.block_until_ready(backend.generate(requests, sampling, jax.random.key(0)).tokens)
    backend.update_weights(state | {"hazard": jnp.asarray(hazard)}, 1)
    with profiled(profile):
        start, cpu = time.perf_counter(), time.process_time()
        out = backend.generate(requests, sampling, jax.random.key(1))
        lengths = np.asarray(jax.block_until_ready(out.lengths))
    return time.perf_counter() - start, time.process_time() - cpu, lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--steps-per-sync", type=int, default=8)
    parser.add_argument("--page-size", type=int, nargs="+", default=[0],
                        help="paged engine: tokens a page (several: one paged run each; 0: 64 on TPU, 16 elsewhere)")
    parser.add_argument("--tpu-block-tokens", type=int, nargs="+", default=[attention_lib.TPU_BLOCK_TOKENS],
                        help="paged engine on TPU: tokens a Pallas kernel block of pages (several: one run each)")
    parser.add_argument("--tpu-queries-per-block", type=int, nargs="+", default=[attention_lib.TPU_QUERIES_PER_BLOCK],
                        help="paged engine on TPU: query tokens a ragged-kernel grid step takes (several: one run each)")
    parser.add_argument("--engines", nargs="+", default=["static", "paged"])
    parser.add_argument("--model-preset", default=None,
                        help="an rl_models preset (e.g. qwen2_0_5b_shape) instead of the small model")
    parser.add_argument("--dtype", default="float32", help="compute dtype (bfloat16 on accelerators)")
    parser.add_argument("--model", default=None, help="a Hugging Face folder whose model to run (real weights)")
    parser.add_argument("--mean-fraction", type=float, default=0.2,
                        help="mean completion length over max_new_tokens (0: every completion runs to the maximum)")
    parser.add_argument("--decode-attention", nargs="+", default=["lanes"], choices=["lanes", "live", "masked"],
                        help="static engine on an accelerator: a decode step's attention (several: one run each)")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="trace each timed rollout to DIR/<max_new>-<engine> and print its costliest ops")
    args = parser.parse_args()
    keep_freed_memory()
    unroll_threefry_on_cpu()
    compile_count()
    vocab = CharTokenizer().vocab_size
    real: dict | None = None
    if args.model:
        config = load_hf_config(args.model, dtype=args.dtype, param_dtype=args.dtype)
        vocab = config.vocab_size
        real = nnx.to_pure_dict(nnx.state(load_hf_model(args.model, dtype=args.dtype, param_dtype=args.dtype)))
    elif args.model_preset:
        config = preset(args.model_preset, vocab_size=vocab, dtype=args.dtype)
    else:
        config = TransformerConfig(vocab_size=vocab, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
                                   mlp_hidden_size=512, dtype=args.dtype)
    eos = vocab - 1
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, eos, (args.prompts, PROMPT_TOKENS)).astype(np.int32)
    requests = Requests(tokens, np.ones_like(tokens), args.samples)
    sampling = SamplingParams(temperature=1.0)
    print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; {args.prompts} prompts x "
          f"{args.samples} samples, prompt {PROMPT_TOKENS} tokens")
    print(f"{'max_new':>8} {'engine':>7} {'mean_len':>8} {'max_len':>7} {'tokens':>8} {'seconds':>8} "
          f"{'cpu_s':>8} {'tokens/s':>9} {'tok/cpu-s':>9} {'programs':>8} {'ms/step':>8} {'floor':>6}")
    for t in args.new_tokens:
        model = scheduled_model(config, eos, t)(config, rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(model)
        state = nnx.to_pure_dict(state) | (real or {})
        hazard = lognormal_hazard(t, args.mean_fraction)
        slots = min(args.slots, args.prompts * args.samples)  # as rl_core.rollout.factory caps them
        rates = {}
        runs = [(f"static/{way}" if len(args.decode_attention) > 1 else "static", 0, 0, 0, way)
                for way in args.decode_attention] if "static" in args.engines else []
        if "paged" in args.engines:
            runs += [("paged", ps, bt, qb, "masked") for ps in args.page_size for bt in args.tpu_block_tokens
                     for qb in args.tpu_queries_per_block]
        for name, page_size, block_tokens, queries, way in runs:
            before = compile_count()
            if name.startswith("static"):
                attention_lib_models.DECODE_ATTENTION = way  # read when the program is traced
                backend = StaticBackend(Sampler(graphdef, max_new_tokens=t, eos_ids=(eos,), pad_id=0))
            else:
                attention_lib.TPU_BLOCK_TOKENS = block_tokens  # read when the engine picks its kernel
                attention_lib.TPU_QUERIES_PER_BLOCK = queries
                settings = EngineSettings(max_prompt_tokens=PROMPT_TOKENS, max_new_tokens=t, page_size=page_size,
                                          slots=slots, prefill_chunk=64, steps_per_sync=args.steps_per_sync)
                backend = PagedBackend(graphdef, settings, paging=ScheduledPaging(), eos_ids=(eos,), pad_id=0)
                if len(runs) > 2:
                    name = f"p{settings.page_size}/b{block_tokens}" + (f"/q{queries}" if queries > 1 else "")
            profile = f"{args.profile}/{t}-{name.replace('/', '-')}" if args.profile else None
            seconds, cpu, lengths = run_one(backend, state, requests, hazard, sampling, profile)
            rates[name] = lengths.sum() / cpu
            floor = decode_floor_ms(config, len(tokens) * args.samples, float(lengths.mean()))
            print(f"{t:>8} {name:>7} {lengths.mean():>8.1f} {lengths.max():>7} {lengths.sum():>8} {seconds:>8.2f} "
                  f"{cpu:>8.2f} {lengths.sum() / seconds:>9.0f} {rates[name]:>9.0f} {compile_count() - before:>8} "
                  f"{1e3 * seconds / lengths.max():>8.2f} {'' if floor is None else f'{floor:.2f}':>6}", flush=True)
            if profile:
                print("\n".join(summarise(profile)["lines"]), flush=True)
        if len(rates) == 2 and "paged" in rates and "static" in rates:
            print(f"{t:>8}   paged / static tokens per cpu-second: {rates['paged'] / rates['static']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
