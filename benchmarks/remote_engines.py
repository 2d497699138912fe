"""Two local engine servers (`rollout.engine=remote`) against the in-process paged engine on the same work.

    uv run python benchmarks/remote_engines.py --model DIR [--prompts 16] [--samples 2] [--new-tokens 64] [--repeats 3]

DIR: a Hugging Face folder (tests/fixtures/hf/qwen2, the tiny committed model; or SmolLM2-135M-Instruct).
Both sides get the same weights (the folder's, scaled by 1.01 so they are a "new version") and the
same requests, sampled at temperature 1 with the same key, and generate the same tokens (checked).

- step: one rollout of --prompts prompts x --samples samples (median of --repeats, after one untimed
  run that compiles): in-process `PagedBackend.generate`; remote: `RemoteBackend.generate`, the
  prompts dealt over two `trainer serve` processes on this host;
- publish: the remote engine's `update_weights` per version: writing the safetensors snapshot to a
  folder, and until both servers loaded it; the same streamed (`weights_url=stream`: the bytes sent
  to each server); the in-process engine's own weight copy beside them;
- tokens/s: generated tokens over the step's wall time.

On a host with fewer cores than servers the servers share them: what this measures there is the
overhead of the route (HTTP, JSON, the snapshot), not the gain of more engines.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from rl_core.policy import left_pad
from rl_core.rollout import EngineSettings, PagedBackend, Requests
from rl_core import SamplingParams
from rl_models import PAGED_TRANSFORMER
from rl_models.hf import load_hf_model, load_hf_tokenizer
from trainer.remote import local
from trainer.remote.engine import RemoteBackend


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    model = load_hf_model(args.model)
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: x * 1.01, params))
    graphdef, state = nnx.split(model)
    eos = load_hf_tokenizer(args.model).eos_ids  # the servers' own (they load the folder's tokenizer)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 200, int(n)).tolist() for n in rng.integers(4, 24, args.prompts)]
    tokens, mask = left_pad(prompts, pad_id=0, max_tokens=32)
    requests = Requests(tokens, mask, num_samples=args.samples)
    sampling, key = SamplingParams(temperature=1.0), jax.random.key(0)
    shapes = dict(max_prompt_tokens=32, max_new_tokens=args.new_tokens, page_size=16, slots=32, prefill_chunk=64,
                  steps_per_sync=8)

    engine = PagedBackend(graphdef, EngineSettings(**shapes), paging=PAGED_TRANSFORMER, eos_ids=eos, pad_id=0)
    urls = local.launch(args.model, 2, max_prompt_tokens=32, max_new_tokens=args.new_tokens, slots=32, page_size=16,
                        steps_per_sync=8, prefill_chunk=64)
    try:
        streamed = RemoteBackend(urls, max_new_tokens=args.new_tokens, pad_id=0, weights_url="stream")
        remote = RemoteBackend(urls, max_new_tokens=args.new_tokens, pad_id=0, weights_url=tempfile.mkdtemp())
        copy = []
        for version in range(1, args.repeats + 2):  # the first: compiles
            start = time.perf_counter()
            engine.update_weights(state, version)
            jax.block_until_ready(engine.weights)
            copy.append(time.perf_counter() - start)
            streamed.update_weights(state, 2 * version)
            remote.update_weights(state, 2 * version + 1)
        rows = {}
        for name, backend in (("in-process", engine), ("remote, 2 servers", remote)):
            backend.generate(requests, sampling, key)  # compiles
            walls = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                out = backend.generate(requests, sampling, key)
                walls.append(time.perf_counter() - start)
            rows[name] = (statistics.median(walls), int(np.asarray(out.lengths).sum()), out)
        same = np.array_equal(np.asarray(rows["in-process"][2].tokens), rows["remote, 2 servers"][2].tokens)
        print(f"model {args.model.name}: {args.prompts} prompts x {args.samples} samples x {args.new_tokens} new "
              f"tokens; same tokens: {same}")
        print("| engine | step (s, median) | generated tokens | tokens/s |")
        print("| --- | --- | --- | --- |")
        for name, (wall, n, _) in rows.items():
            print(f"| {name} | {wall:.3f} | {n} | {n / wall:.0f} |")
        print(f"publish per version (median of {args.repeats}): snapshot {statistics.median(remote.publish_seconds[1:]):.3f} s "
              f"({remote.snapshot_bytes / 2**20:.1f} MiB), until both servers loaded it "
              f"{statistics.median(remote.load_seconds[1:]):.3f} s; in-process weight copy "
              f"{statistics.median(copy[1:]):.3f} s; streamed: serialising "
              f"{statistics.median(streamed.publish_seconds[1:]):.3f} s, until both servers loaded it "
              f"{statistics.median(streamed.load_seconds[1:]):.3f} s")
    finally:
        local.stop()


if __name__ == "__main__":
    main()
