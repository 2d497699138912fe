"""The paged engine serving jobs that arrive while it runs (rl_core.rollout.serving)."""

import threading
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from rl_core.rollout.backend import Requests
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.sampler import GREEDY, SamplingParams
from rl_core.rollout.serving import EngineLoop, Job
from rl_core.policy.tokens import left_pad
from rl_models import PAGED_TRANSFORMER
from rl_models.hf import load_hf_model, load_hf_tokenizer
from tolerances import approx

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen2"
SMALL = dict(max_prompt_tokens=16, max_new_tokens=10, page_size=4, slots=3, prefill_chunk=8, steps_per_sync=3,
             top_logprobs=4)
PROMPTS = [[5, 9, 11], [40, 41, 42, 43, 44, 45, 46, 47, 48], [7], [100, 101, 102, 103, 104]]


@pytest.fixture(scope="module")
def engine():
    graphdef, state = nnx.split(load_hf_model(HF))
    engine = PagedBackend(graphdef, EngineSettings(**SMALL), paging=PAGED_TRANSFORMER, eos_ids=(301,), pad_id=0)
    engine.update_weights(state, 3)
    return engine


@pytest.fixture(scope="module")
def loop(engine):
    loop = EngineLoop(engine, load_hf_tokenizer(HF).decode, key=jax.random.key(5))
    yield loop
    loop.close()


def rollout(engine, prompts, sampling, key, *, num_samples=1, ids=None):
    out = engine.generate(Requests(*left_pad(prompts, pad_id=0, max_tokens=16), num_samples=num_samples,
                                   prompt_ids=ids), sampling, key)
    return [np.asarray(out.tokens[i, : out.lengths[i]]).tolist() for i in range(len(out.lengths))]


def test_concurrent_greedy_jobs_equal_one_rollout_of_them(engine, loop):
    want = rollout(engine, PROMPTS, GREEDY, jax.random.key(5))
    futures = [loop.submit(Job(p, GREEDY)) for p in PROMPTS]
    got = [f.result()[0] for f in futures]
    assert [s.tokens for s in got] == want
    assert all(s.version == 3 for s in got)
    assert {s.finish for s in got} <= {"stop", "length"} and got[0].finish == ("length" if len(want[0]) == 10 else "stop")


def test_a_job_arriving_mid_rollout_joins_it(loop):
    """The second job is submitted from the first's token stream, while it decodes: one busy period serves both."""
    second: list = []

    def on_tokens(j, tokens):
        if not second:
            second.append(loop.submit(Job(PROMPTS[1], GREEDY)))

    before = loop.rollouts
    first = loop.submit(Job(PROMPTS[0], GREEDY, max_new_tokens=10, on_tokens=on_tokens)).result()
    joined = second[0].result()
    assert loop.rollouts == before + 1
    assert joined[0].tokens == loop.generate(Job(PROMPTS[1], GREEDY))[0].tokens
    assert len(first[0].tokens) >= 1


def test_a_seed_gives_the_same_samples_whatever_runs_beside(engine, loop):
    hot = SamplingParams(temperature=1.0)
    alone = loop.generate(Job(PROMPTS[3], hot, num_samples=3, seed=11))
    threads = [threading.Thread(target=loop.generate, args=(Job(p, hot, num_samples=2),)) for p in PROMPTS]
    for t in threads:
        t.start()
    crowded = loop.generate(Job(PROMPTS[3], hot, num_samples=3, seed=11))
    for t in threads:
        t.join()
    assert [s.tokens for s in crowded] == [s.tokens for s in alone]
    # the same keys as a rollout naming the seed as its prompt id: fold_in(fold_in(key, 11), j)
    assert [s.tokens for s in alone] == rollout(engine, [PROMPTS[3]], hot, jax.random.key(5), num_samples=3, ids=[11])
    assert len({tuple(s.tokens) for s in alone}) > 1  # three samples, not one repeated


def test_a_stop_string_cuts_the_sample_after_its_token(loop):
    decode = loop.decode
    free = loop.generate(Job(PROMPTS[1], GREEDY))[0]
    assert len(free.tokens) >= 4
    stop = decode(free.tokens[:3])[-1:]  # the last character of the third token's text
    first = next(i for i in range(1, len(free.tokens) + 1) if stop in decode(free.tokens[:i]))
    cut = loop.generate(Job(PROMPTS[1], GREEDY, stops=(stop,)))[0]
    assert cut.tokens == free.tokens[:first] and cut.finish == "stop"
    assert cut.logp == approx(free.logp[:first], abs=1e-5)


def test_a_bad_job_fails_alone(loop):
    good = loop.submit(Job(PROMPTS[0], GREEDY))
    long = loop.submit(Job(list(range(3, 40)), GREEDY))
    with pytest.raises(ValueError, match="37 tokens: more than the engine's max_prompt_tokens"):
        long.result()
    assert len(good.result()[0].tokens) >= 1
    with pytest.raises(ValueError, match="a job with a session has one sample, not 2"):
        loop.generate(Job(PROMPTS[0], GREEDY, num_samples=2, session=4))


def test_top_logprobs_hold_the_likeliest_tokens_under_the_tempered_softmax(loop):
    greedy = loop.generate(Job(PROMPTS[1], GREEDY))[0]
    assert len(greedy.top) == len(greedy.tokens)
    for token, logp, (ids, logps) in zip(greedy.tokens, greedy.logp, greedy.top, strict=True):
        assert len(ids) == 4 and logps == sorted(logps, reverse=True)
        assert ids[0] == token and logps[0] == approx(logp, abs=1e-6)  # greedy takes the likeliest
    hot = loop.generate(Job(PROMPTS[1], SamplingParams(temperature=2.0), seed=3))[0]
    for token, logp, (ids, logps) in zip(hot.tokens, hot.logp, hot.top, strict=True):
        assert logps[0] >= logp  # under the same tempered softmax the sampled token's log-prob is reported
        if token in ids:
            assert logps[ids.index(token)] == approx(logp, abs=1e-6)


def test_a_burst_at_an_idle_engine_starts_as_one_rollout(engine):
    """Jobs arriving at an idle engine within `linger_s` of each other start together: one rollout, the
    same tokens as one `generate` call of them all."""
    burst = EngineLoop(engine, load_hf_tokenizer(HF).decode, key=jax.random.key(5), linger_s=0.5, linger_max_s=2.0)
    try:
        futures = [burst.submit(Job(p, GREEDY)) for p in PROMPTS]
        got = [f.result()[0].tokens for f in futures]
        assert burst.rollouts == 1 and burst.calls == engine_calls_of_one_rollout(engine)
        assert got == rollout(engine, PROMPTS, GREEDY, jax.random.key(5))
    finally:
        burst.close()


def engine_calls_of_one_rollout(engine) -> int:
    """Device calls of one `generate` of PROMPTS (greedy), counted on the engine."""
    calls = [0]
    call = engine.call

    def counted(*args):
        calls[0] += 1
        return call(*args)

    engine.call = counted
    try:
        rollout(engine, PROMPTS, GREEDY, jax.random.key(5))
    finally:
        del engine.call
    return calls[0]


def test_an_abandoning_close_fails_the_running_jobs_at_the_next_device_call(engine):
    """close(abandon=True), as a stopping server calls it, ends a rollout after the call under way; a plain
    close lets it finish (its 10 tokens)."""
    for abandon in (True, False):
        loop = EngineLoop(engine, load_hf_tokenizer(HF).decode, key=jax.random.key(5))
        calls: list[int] = []

        def on_tokens(j, tokens, loop=loop, calls=calls):  # on the loop's thread, after each device call
            calls.append(len(tokens))
            if len(calls) == 1:
                threading.Thread(target=loop.close, kwargs={"abandon": abandon}).start()
                while loop._inbox.empty():  # the close request is in before the next call
                    pass

        future = loop.submit(Job(PROMPTS[0], GREEDY, max_new_tokens=10, stops=(), on_tokens=on_tokens))
        if abandon:
            with pytest.raises(RuntimeError, match="the engine loop closed before this request finished"):
                future.result(timeout=60)
            assert calls == [3]  # steps_per_sync = 3: one device call, then none
        else:  # the whole greedy sample
            assert future.result(timeout=60)[0].tokens == rollout(engine, [PROMPTS[0]], GREEDY, jax.random.key(5))[0]
        loop._thread.join(timeout=60)
        assert not loop._thread.is_alive()


def test_a_rollout_that_cannot_start_fails_the_jobs_waiting_for_it_and_the_loop_goes_on(engine, loop):
    """No program for the jobs' settings (here: an engine that cannot build one): they fail, the loop
    does not retry them forever, and the next job runs."""
    want = loop.generate(Job(PROMPTS[0], GREEDY))[0].tokens

    def broken(sampling):
        raise RuntimeError("no program for these settings")

    engine.step_program = broken
    try:
        with pytest.raises(RuntimeError, match="no program for these settings"):
            loop.generate(Job(PROMPTS[0], GREEDY))
    finally:
        del engine.step_program
    assert loop.generate(Job(PROMPTS[0], GREEDY))[0].tokens == want
