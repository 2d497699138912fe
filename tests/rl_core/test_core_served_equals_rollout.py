"""One host loop (rl_core.rollout.scheduler.HostLoop) for training rollouts and the server: a job
served through `EngineLoop` (the path `trainer serve` takes, without HTTP) and a rollout through
`PagedBackend.generate` of the same prompt and key give the same tokens, with the features that
each path had alone before: stop strings and per-prompt limits, weights published mid-generation
(partial rollouts), a mixture of experts' routing."""

from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Requests
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.sampler import SamplingParams
from rl_core.rollout.serving import EngineLoop, Job, cut_at_stop
from rl_models import PAGED_TRANSFORMER, Transformer, TransformerConfig
from rl_models.hf import load_hf_model, load_hf_tokenizer
from engines import paged_engine
from tolerances import approx

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
HOT = SamplingParams(temperature=1.0)
KEY = 5
# (prompt, its prompt id = the served job's seed, its limit, its stop strings)
JOBS = [([5, 9, 11], 11, 10, ()), ([40, 41, 42, 43, 44, 45, 46, 47, 48], 3, 6, ("hin",)), ([7], 900, 10, (" is", "A")),
        ([100, 101, 102, 103, 104], 42, 8, ())]
G = 3


def rows(out, i: int) -> list[list[int]]:
    """Prompt i's G completions of a rollout."""
    return [np.asarray(out.tokens[r, : out.lengths[r]]).tolist() for r in range(i * G, (i + 1) * G)]


def test_served_jobs_give_the_rollouts_tokens_for_the_same_prompt_and_key():
    """Four jobs sampled G = 3 times at temperature 1, each keyed by its seed and submitted at once
    (the loop admits them as they come, between device calls, so their batches differ from the
    rollout's), against one rollout naming the seeds as prompt ids: the same tokens, cut at the
    same stop strings and limits, and the same log-probs."""
    tokenizer = load_hf_tokenizer(HF / "qwen2")
    settings = dict(max_prompt_tokens=16, max_new_tokens=10, page_size=4, slots=3, prefill_chunk=8, steps_per_sync=3)
    engine = paged_engine(load_hf_model(HF / "qwen2"), settings, eos_ids=(301,), version=3)
    loop = EngineLoop(engine, tokenizer.decode, key=jax.random.key(KEY))
    try:
        futures = [loop.submit(Job(p, HOT, num_samples=G, max_new_tokens=n, stops=stops, seed=seed))
                   for p, seed, n, stops in JOBS]
        served = [f.result(timeout=600) for f in futures]
        tokens, mask = left_pad([p for p, *_ in JOBS], pad_id=0, max_tokens=16)
        requests = Requests(tokens, mask, G, prompt_ids=np.asarray([seed for _, seed, _, _ in JOBS]),
                            max_new_tokens=np.asarray([n for *_, n, _ in JOBS]),
                            stop_strings=[stops for *_, stops in JOBS], decode=tokenizer.decode)
        # on the loop's thread, as the server's token route runs it
        out = loop.call(lambda: engine.generate(requests, HOT, jax.random.key(KEY)))
    finally:
        loop.close()
    cut = 0
    for i, (_, _, limit, stops) in enumerate(JOBS):
        for j, (sample, row) in enumerate(zip(served[i], rows(out, i), strict=True)):
            want, stopped = cut_at_stop(row, stops, tokenizer.decode)  # the rollout may run a token past a stop
            assert sample.tokens == want, (i, j)
            assert len(want) <= limit and sample.version == 3
            assert sample.logp == approx(np.asarray(out.logp)[i * G + j, : len(want)].tolist(), abs=1e-5)
            cut += stopped
        assert len({tuple(s.tokens) for s in served[i]}) > 1  # G samples, not one repeated
    assert cut >= 4  # stop strings ended samples of both prompts that have them, on both paths


def tiny(seed: int) -> Transformer:
    return Transformer(TransformerConfig.tiny(64), rngs=nnx.Rngs(seed))


@pytest.mark.parametrize("mode", ["continue", "recompute"])
def test_weights_published_mid_generation_reach_a_served_job_as_a_rollout(mode):
    """Partial rollouts through the server: new weights published after the first device call
    decode the following ones, as in a rollout given them at the same call (before one loop, the
    server never read the engine's feed)."""
    settings = EngineSettings(max_prompt_tokens=10, max_new_tokens=10, page_size=4, slots=4, prefill_chunk=16,
                              steps_per_sync=2)
    old, new = (nnx.split(tiny(seed))[1] for seed in (0, 1))
    engine = PagedBackend(nnx.split(tiny(0))[0], settings, paging=PAGED_TRANSFORMER, eos_ids=(65,), pad_id=0,
                          partial_rollouts=mode)  # EOS 65 is never sampled: every sample runs 10 tokens
    prompt = [12, 30, 7, 51, 9]
    engine.update_weights(old, 0)
    call = type(engine).call.__get__(engine)
    calls = [0]

    def publishing(*args):
        out = call(*args)
        calls[0] += 1
        if calls[0] == 1:
            engine.publish(new, 1)
        return out

    engine.call = publishing
    try:
        tokens, mask = left_pad([prompt], pad_id=0, max_tokens=10)
        out = engine.generate(Requests(tokens, mask, 4, prompt_ids=np.asarray([7])), HOT, jax.random.key(KEY))
    finally:
        del engine.call
    np.testing.assert_array_equal(out.token_version, [[0, 0] + [1] * 8] * 4)  # call 1 made 2 tokens

    engine.update_weights(old, 0)
    loop = EngineLoop(engine, lambda ids: "", key=jax.random.key(KEY))
    published = []

    def on_tokens(j, tokens):  # on the loop's thread, after call 1
        if not published:
            published.append(engine.publish(new, 1))

    try:
        alone = loop.generate(Job(prompt, HOT, num_samples=4, seed=7))  # the old weights throughout
        served = loop.generate(Job(prompt, HOT, num_samples=4, seed=7, on_tokens=on_tokens))
    finally:
        loop.close()
    assert published == [True] and engine.version == 1 and engine.switches == 2
    for j, sample in enumerate(served):
        assert sample.tokens == np.asarray(out.tokens[j]).tolist() and sample.version == 0
        assert sample.logp == approx(np.asarray(out.logp[j]).tolist(), abs=1e-5)
        assert sample.tokens[:2] == alone[j].tokens[:2]  # sampled before the switch
    assert [s.tokens for s in served] != [s.tokens for s in alone]  # the new weights sampled the rest


@pytest.mark.e2e  # compiles the mixture's programs: several seconds on 2 shared cores
def test_a_served_job_records_the_rollouts_routing():
    """A mixture of experts (the tiny Qwen3-MoE fixture): a served sample's routing is the rows of
    a rollout's `Completions.routing` for the same prompt and key (before one loop, only
    rollouts recorded it)."""
    settings = dict(max_prompt_tokens=10, max_new_tokens=8, page_size=4, slots=3, prefill_chunk=8, steps_per_sync=3)
    engine = paged_engine(load_hf_model(HF / "qwen3_moe"), settings, eos_ids=tuple(range(6, 60)))
    prompt = [61, 80, 99, 120, 150, 201]
    tokens, mask = left_pad([prompt], pad_id=0, max_tokens=10)
    out = engine.generate(Requests(tokens, mask, 2, prompt_ids=np.asarray([4])), HOT, jax.random.key(KEY))
    loop = EngineLoop(engine, lambda ids: "", key=jax.random.key(KEY))
    try:
        served = loop.generate(Job(prompt, HOT, num_samples=2, seed=4))
    finally:
        loop.close()
    assert out.routing is not None
    for j, sample in enumerate(served):
        n = int(out.lengths[j])
        assert sample.tokens == np.asarray(out.tokens[j, :n]).tolist()
        assert sample.routing is not None and sample.routing.shape == (n, *out.routing.shape[2:])
        np.testing.assert_array_equal(sample.routing, out.routing[j, :n])

