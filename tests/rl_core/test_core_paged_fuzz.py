"""The paged engine's scheduler (rl_core.rollout.scheduler) under random small pools: it always
finishes, in a bounded number of device calls, with the completions of a roomy pool, and leaves
no page held, even after an exception mid-rollout.

Programs are few and compiled once: each engine shape below keeps its roomy device pool and
the examples swap in a smaller host pool (`engine.pools`), which only limits the pages the
scheduler hands out; the prompts, samples per prompt, EOS-driven completion lengths and keys
vary freely on the host.
"""

import itertools
import math

import jax
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Requests
from rl_core.rollout.pages import PagePool
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.sampler import GREEDY, SamplingParams
from rl_core.rollout.scheduler import pages_for_one
from rl_models import PAGED_TRANSFORMER, Transformer, TransformerConfig
from tolerances import close

V = 64
EOS = (3, 4, 5)  # ~5% of sampled tokens: completions end at mixed lengths
SAMPLED = SamplingParams(temperature=1.0)
MAX_PROMPT = 10
SHAPES = (  # page size, slots, prefill chunk, steps per call, new tokens
    dict(page_size=2, slots=1, prefill_chunk=4, steps_per_sync=2, max_new_tokens=9),
    dict(page_size=4, slots=2, prefill_chunk=8, steps_per_sync=3, max_new_tokens=12),
    dict(page_size=3, slots=3, prefill_chunk=5, steps_per_sync=1, max_new_tokens=7),
)


@pytest.fixture(scope="module")
def engines():
    graphdef, state = nnx.split(Transformer(TransformerConfig.tiny(V), rngs=nnx.Rngs(0)))
    out = []
    for shape in SHAPES:
        engine = PagedBackend(graphdef, EngineSettings(max_prompt_tokens=MAX_PROMPT, **shape),
                              paging=PAGED_TRANSFORMER, eos_ids=EOS, pad_id=0)
        engine.update_weights(state, 0)
        out.append(engine)
    return out


def counting(engine, limit):
    """Count the engine's device calls; fail past `limit` (a scheduler that never finishes)."""
    calls = [0]
    call = type(engine).call.__get__(engine)

    def counted(*args):
        calls[0] += 1
        if calls[0] > limit:
            raise AssertionError(f"more than {limit} device calls: the scheduler does not finish")
        return call(*args)

    engine.call = counted
    return calls


def requests(lengths, samples, seed):
    rng = np.random.default_rng(seed)
    return Requests(*left_pad([rng.integers(6, V, n).tolist() for n in lengths], pad_id=0, max_tokens=MAX_PROMPT),
                    num_samples=samples)


def rollout(engine, pages, reqs, sampling, key, held=False):
    """(completions, device calls, preemptions) with a host pool of `pages` pages; every page
    must be free afterwards, but (`held`) those of retained sequences, kept in the same pool."""
    s = engine.settings
    if not held or engine.pools[0].num_pages != pages:
        engine.release()
        engine.pools = [PagePool(pages)]
    before = engine.counters().preemptions
    prompts, samples = len(reqs.prompt_tokens), len(reqs.prompt_tokens) * reqs.num_samples
    # the oldest running sample advances k tokens every call (it is never preempted, so each
    # sample is the oldest for at most ceil(t / k) calls); the other calls prefill. Generous: a
    # scheduler that livelocks runs into it, one that finishes stays well under it (< 80%)
    decode = samples * math.ceil(s.max_new_tokens / s.steps_per_sync)
    limit = decode + 2 * prompts * math.ceil(MAX_PROMPT / s.prefill_chunk) + 2
    calls = counting(engine, limit)
    try:
        out = engine.generate(reqs, sampling, key)
    finally:
        del engine.call
    held_pages = {p for x in engine.retained.held.values() for p in x.pages}
    assert engine.pools[0].in_use == len(held_pages)
    assert all(engine.pools[0].refcount(p) == 0 for p in range(pages) if p not in held_pages)
    return out, calls[0], engine.counters().preemptions - before


def assert_same(got, want):
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.lengths, want.lengths)
    np.testing.assert_array_equal(got.truncated, want.truncated)
    np.testing.assert_allclose(got.logp, want.logp, **close(rtol=1e-6, atol=1e-6))  # other slots, same program


@settings(max_examples=100, deadline=None, derandomize=True)
@given(data=st.data())
def test_any_pool_that_fits_one_completion_finishes_with_the_roomy_completions(engines, data):
    shape = data.draw(st.integers(0, len(SHAPES) - 1), label="shape")
    engine = engines[shape]
    s = engine.settings
    lengths = data.draw(st.lists(st.integers(1, MAX_PROMPT), min_size=1, max_size=4), label="prompt lengths")
    samples = data.draw(st.integers(1, 3), label="samples per prompt")
    one = max(pages_for_one(s.page_size, n, s.max_new_tokens) for n in lengths)  # not always the longest's
    pages = data.draw(st.integers(one + 1, one + 1 + 2 * s.slots), label="pool pages")  # 1 + what one needs and up
    reqs = requests(lengths, samples, data.draw(st.integers(0, 2**16), label="prompt seed"))
    key = jax.random.key(data.draw(st.integers(0, 2**16), label="key"))

    want, _, roomy_preemptions = rollout(engine, s.pool_pages, reqs, SAMPLED, key)
    got, calls, _ = rollout(engine, pages, reqs, SAMPLED, key)
    assert roomy_preemptions == 0
    assert_same(got, want)


def test_the_reported_livelock_finishes_at_once():
    """2 prompts of 4 tokens, 12 new tokens, 4-token pages, 2 slots, 6 pages (5 usable: one
    completion needs 5): it preempted its only running sample forever (201 calls, 66 preemptions)."""
    graphdef, state = nnx.split(Transformer(TransformerConfig.tiny(V), rngs=nnx.Rngs(0)))
    settings_ = dict(max_prompt_tokens=16, max_new_tokens=12, page_size=4, slots=2, prefill_chunk=8, steps_per_sync=3)
    engine = PagedBackend(graphdef, EngineSettings(**settings_, num_pages=6), paging=PAGED_TRANSFORMER,
                          eos_ids=(V + 1,), pad_id=0)  # never emitted: every completion runs its 12 tokens
    engine.update_weights(state, 0)
    reqs = Requests(*left_pad([[10, 11, 12, 13], [20, 21, 22, 23]], pad_id=0, max_tokens=16))
    assert pages_for_one(4, 4, 12) == 5
    out, calls, preemptions = rollout(engine, 6, reqs, GREEDY, jax.random.key(0))
    assert (out.lengths == 12).all()
    # a's 4 calls (the 4th frees b's prefix rather than a), then b's 4 after it is prefilled again
    assert calls == 8 and preemptions == 1


def test_a_pool_that_cannot_hold_a_short_prompts_completion_is_a_clear_error(engines):
    """The fuzz's find: 4 usable pages of 4 tokens hold a 5-token prompt's completion of 12 (1
    prefix page + 3 own) but not a 2-token one's (its partly filled prefix page, its copy and 3
    more): an error naming the settings before any device call, not a stall mid-rollout."""
    engine = engines[1]
    engine.pools = [PagePool(5)]
    assert pages_for_one(4, 5, 12) == 4 and pages_for_one(4, 2, 12) == 5
    engine.call = None  # never reached
    try:
        with pytest.raises(ValueError, match=r"num_pages = 5: 4 usable .*page_size = 4.* 12 new tokens "
                                             r".* 2-token prompt need 5 pages. Set rollout.options.num_pages >= 6"):
            engine.generate(requests((2, 5), 1, seed=0), SAMPLED, jax.random.key(0))
    finally:
        del engine.call
    assert engine.pools[0].in_use == 0


def test_an_exception_mid_rollout_frees_every_page_and_the_engine_runs_again(engines):
    engine = engines[1]
    reqs = requests((7, 3, 9), 2, seed=1)
    key = jax.random.key(1)
    want, _, _ = rollout(engine, engine.settings.pool_pages, reqs, SAMPLED, key)
    call = engine.call
    for donated in (False, True):  # failing before the step runs, or after it took the device pool
        calls = [0]

        def failing(*args):
            calls[0] += 1
            if calls[0] == 3:
                if donated:
                    jax.tree.map(lambda x: x.delete(), engine.pages)
                raise KeyboardInterrupt("interrupted mid-rollout")
            return call(*args)

        engine.call = failing
        with pytest.raises(KeyboardInterrupt):
            engine.generate(reqs, SAMPLED, key)
        del engine.call
        assert engine.pools[0].in_use == 0
        got, _, _ = rollout(engine, engine.settings.pool_pages, reqs, SAMPLED, key)
        assert_same(got, want)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(data=st.data())
def test_continued_sequences_under_any_pool_finish_with_the_completions_of_a_full_prefill(engines, data):
    """Two turns: every sample's sequence retained (`Requests.sessions`), then continued by a
    prompt that keeps some of its tokens and adds a few; in a pool that fits one completion,
    held sequences are given back (the prompt then prefilled whole), and the second turn equals
    the roomy pool's prefill of the whole history. Released, nothing stays held."""
    engine = engines[data.draw(st.integers(0, len(SHAPES) - 1), label="shape")]
    s = engine.settings
    lengths = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3), label="prompt lengths")
    samples = data.draw(st.integers(1, 2), label="samples per prompt")
    reqs = requests(lengths, samples, data.draw(st.integers(0, 2**16), label="prompt seed"))
    key = jax.random.key(data.draw(st.integers(0, 2**16), label="key"))
    history_most = MAX_PROMPT - 1  # the continued prompts stay within max_prompt_tokens
    one = max(pages_for_one(s.page_size, n, s.max_new_tokens) for n in range(1, history_most + 1))
    pages = data.draw(st.integers(one + 1, one + 1 + 2 * s.slots), label="pool pages")
    handles = engine.new_sessions(len(lengths) * samples)

    first, _, _ = rollout(engine, pages, reqs._replace(sessions=handles), SAMPLED, key, held=True)
    history = []
    for row in range(len(handles)):
        prompt = reqs.prompt_tokens[row // samples][reqs.prompt_mask[row // samples] > 0].tolist()
        kept = first.tokens[row, : data.draw(st.integers(1, int(first.lengths[row])), label="kept")].tolist()
        new = data.draw(st.lists(st.integers(6, V - 1), max_size=3), label="new tokens")
        history.append((prompt + kept + new)[:history_most])
    continued = Requests(*left_pad(history, pad_id=0, max_tokens=MAX_PROMPT), prompt_ids=np.arange(len(history)) + 50)
    got, _, _ = rollout(engine, pages, continued._replace(sessions=handles), SAMPLED, key, held=True)
    engine.release(handles)
    assert engine.pools[0].in_use == 0 and not engine.retained.held
    want, _, _ = rollout(engine, s.pool_pages, continued, SAMPLED, key)
    assert_same(got, want)


@pytest.fixture(scope="module")
def switching():
    """Engines of SHAPES[1] that switch weights mid-rollout, one per partial-rollouts mode, the two
    weight versions they switch between, and a version counter (published versions only grow)."""
    graphdef, old = nnx.split(Transformer(TransformerConfig.tiny(V), rngs=nnx.Rngs(0)))
    new = nnx.split(Transformer(TransformerConfig.tiny(V), rngs=nnx.Rngs(1)))[1]
    engines = {mode: PagedBackend(graphdef, EngineSettings(max_prompt_tokens=MAX_PROMPT, **SHAPES[1]),
                                  paging=PAGED_TRANSFORMER, eos_ids=EOS, pad_id=0, partial_rollouts=mode)
               for mode in ("continue", "recompute")}
    return engines, old, new, itertools.count(0, 2)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(data=st.data())
def test_a_weight_switch_at_any_call_keeps_the_old_tokens_and_frees_every_page(switching, data):
    """New weights published after any call, in either mode, with any pool that fits (a resumed
    completion needs one page more under recompute), sequences retained or not, and sometimes an
    exception a call later: the rollout finishes (or fails) with no page held but the retained
    sequences'; each row's old-version tokens come first and are the ones the old weights alone give."""
    engines, old, new, versions = switching
    mode = data.draw(st.sampled_from(("continue", "recompute")), label="mode")
    engine = engines[mode]
    s = engine.settings
    lengths = data.draw(st.lists(st.integers(1, MAX_PROMPT), min_size=1, max_size=4), label="prompt lengths")
    reqs = requests(lengths, data.draw(st.integers(1, 3), label="samples per prompt"), seed=data.draw(
        st.integers(0, 2**16), label="prompt seed"))
    one = max(pages_for_one(s.page_size, n, s.max_new_tokens) for n in lengths) + (mode == "recompute")
    pages = data.draw(st.integers(one + 1, one + 1 + 2 * s.slots), label="pool pages")
    switch = data.draw(st.integers(1, 8), label="switch after call")
    fail = data.draw(st.booleans(), label="fail a call after the switch")
    held = data.draw(st.booleans(), label="retain the sequences (Requests.sessions)")
    key = jax.random.key(data.draw(st.integers(0, 2**16), label="key"))
    v0 = next(versions)
    engine.update_weights(old, v0)
    want, _, _ = rollout(engine, pages, reqs, SAMPLED, key)

    engine.update_weights(old, v0 + 1)  # the same weights, a newer version: the feed's must be newer still
    call, calls = type(engine).call.__get__(engine), [0]

    def switching_call(*args):
        calls[0] += 1
        if fail and calls[0] == switch + 1:
            raise KeyboardInterrupt("interrupted after the switch")
        out = call(*args)
        if calls[0] == switch:
            engine.feed.publish(v0 + 2, new)
        return out

    engine.pools = [PagePool(pages)]
    engine.call = switching_call
    sessions = engine.new_sessions(len(want.lengths)) if held else None
    try:
        got = engine.generate(reqs._replace(sessions=sessions), SAMPLED, key)
    except KeyboardInterrupt:
        assert fail
        got = None
    finally:
        del engine.call
    held_pages = {p for x in engine.retained.held.values() for p in x.pages}
    assert engine.pools[0].in_use == len(held_pages) and (held or not held_pages)
    engine.release()
    assert engine.pools[0].in_use == 0
    if got is None:
        return
    for row in range(len(got.lengths)):
        n = int(got.lengths[row])
        row_versions = got.token_version[row, :n]
        assert n >= 1 and set(row_versions.tolist()) <= {v0 + 1, v0 + 2}
        assert (np.diff(row_versions) >= 0).all()  # the old version's tokens come first
        old_tokens = int((row_versions == v0 + 1).sum())
        np.testing.assert_array_equal(got.tokens[row, :old_tokens], want.tokens[row, :old_tokens])
        assert got.truncated[row] == (got.tokens[row, n - 1] not in EOS)
    assert (calls[0] > switch) == (engine.version == v0 + 2)


@pytest.fixture(scope="module")
def windowed_engine():
    """Every layer a 3-slot window (Mistral v0.1's layout, small): samples give back the pages
    behind their windows as they decode (`EngineSettings` of the second shape)."""
    model = Transformer(TransformerConfig.tiny(V, sliding_window=3), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    engine = PagedBackend(graphdef, EngineSettings(max_prompt_tokens=MAX_PROMPT, **SHAPES[1]),
                          paging=PAGED_TRANSFORMER, eos_ids=EOS, pad_id=0)
    engine.update_weights(state, 0)
    assert engine.kv_window == 3
    return engine


@settings(max_examples=15, deadline=None, derandomize=True)
@given(data=st.data())
def test_a_windowed_models_small_pools_finish_with_the_roomy_completions(windowed_engine, data):
    """Pages given back behind the windows, under pools that fit one completion: the roomy
    pool's completions, every page free afterwards (`rollout` checks)."""
    engine, s = windowed_engine, windowed_engine.settings
    lengths = data.draw(st.lists(st.integers(1, MAX_PROMPT), min_size=1, max_size=4), label="prompt lengths")
    samples = data.draw(st.integers(1, 3), label="samples per prompt")
    one = max(pages_for_one(s.page_size, n, s.max_new_tokens) for n in lengths)
    pages = data.draw(st.integers(one + 1, one + 1 + 2 * s.slots), label="pool pages")
    reqs = requests(lengths, samples, data.draw(st.integers(0, 2**16), label="prompt seed"))
    key = jax.random.key(data.draw(st.integers(0, 2**16), label="key"))
    want, _, _ = rollout(engine, s.pool_pages, reqs, SAMPLED, key)
    got, _, _ = rollout(engine, pages, reqs, SAMPLED, key)
    assert_same(got, want)
