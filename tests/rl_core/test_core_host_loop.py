"""The paged engine's one host loop (rl_core.rollout.scheduler.HostLoop) used directly: what it
reads from the engine, prompts admitted between calls, and what it does on leaving."""

import jax
import numpy as np
import pytest
from flax import nnx

from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.records import completions, prompt_record
from rl_core.rollout.sampler import GREEDY
from rl_core.rollout.scheduler import HostLoop, LoopEngine
from rl_models import PAGED_TRANSFORMER, Transformer, TransformerConfig

V = 64
SETTINGS = EngineSettings(max_prompt_tokens=8, max_new_tokens=6, page_size=4, slots=2, prefill_chunk=8,
                          steps_per_sync=2)


@pytest.fixture(scope="module")
def engine():
    graphdef, state = nnx.split(Transformer(TransformerConfig.tiny(V), rngs=nnx.Rngs(0)))
    engine = PagedBackend(graphdef, SETTINGS, paging=PAGED_TRANSFORMER, eos_ids=(V + 1,), pad_id=0)
    engine.update_weights(state, 2)
    return engine


def record(tokens, pid, samples=1):
    return prompt_record(np.asarray(tokens), SETTINGS, name=f"prompt {pid}", prompt_id=pid, num_samples=samples,
                         limit=SETTINGS.max_new_tokens)


def test_the_paged_engine_has_everything_the_host_loop_reads(engine):
    """`LoopEngine` names what the loop reads; the paged engine it drives has each member."""
    members = set(LoopEngine.__annotations__) | {n for n, v in vars(LoopEngine).items()
                                                 if callable(v) and not n.startswith("_")}
    assert {"settings", "pools", "retained", "call", "step_program", "follow_feed", "reset_after_failure",
            "count"} <= members
    missing = [n for n in sorted(members) if not hasattr(engine, n)]
    assert not missing, f"PagedBackend lacks {missing}"


def test_a_prompt_admitted_mid_loop_gets_the_tokens_it_gets_alone(engine):
    """A prompt admitted after the loop's first call (as the server admits a request) samples what
    it samples in a loop of its own: its key is (prompt id, sample index), not its batch."""
    key = jax.random.key(3)
    with HostLoop(engine, GREEDY, key) as loop:
        alone = record([9, 10, 11, 12, 13], 7, samples=2)
        loop.admit([alone])
        while loop.busy:
            loop.step()
    with HostLoop(engine, GREEDY, key) as loop:
        first, late = record([20, 21, 22], 1), record([9, 10, 11, 12, 13], 7, samples=2)
        loop.admit([first])
        loop.step()
        assert loop.calls == 1 and first.samples[0].tokens  # the first call decoded it
        loop.admit([late])
        while loop.busy:
            loop.step()
    assert [s.tokens for s in late.samples] == [s.tokens for s in alone.samples]
    assert all(len(s.tokens) == SETTINGS.max_new_tokens for s in late.samples + first.samples)  # no EOS
    out = completions(late.samples, SETTINGS.max_new_tokens, pad_id=0, eos_ids=engine.eos_ids, version=engine.version)
    np.testing.assert_array_equal(out.tokens, [s.tokens for s in alone.samples])
    assert out.truncated.all() and (out.version == 2).all()
    assert all(pool.in_use == 0 for pool in engine.pools)


def test_a_page_left_held_is_a_bookkeeping_error_and_the_engine_is_reset(engine):
    """Leaving the loop checks that only retained sequences hold pages: a page nobody gives back is
    a RuntimeError naming the count per replica, and the engine comes out with every page free."""
    before = engine.counters().prefill_tokens
    with pytest.raises(RuntimeError, match=r"scheduler bug: pages still held after the rollout \(\[1\] per replica\)"):
        with HostLoop(engine, GREEDY, jax.random.key(0)) as loop:
            loop.admit([record([5, 6, 7, 8, 9], 0)])
            while loop.busy:
                loop.step()
            engine.pools[0].allocate(1)  # a page no record holds
    assert engine.pools[0].in_use == 0
    assert engine.counters().prefill_tokens == before + 4  # what it did is counted all the same (a 4-token prefix)


def test_a_prompt_no_pool_can_finish_is_refused_before_anything_is_taken(engine):
    """A 6-token prompt's 6 new tokens need 4 pages of 4 tokens: 2 for its 5-token prefix, then its
    own copy of the partly filled one and 1 more (positions 4..11; it writes up to 5 + 6 - 1 = 10).
    A pool of 3 usable pages refuses it when it is admitted, not mid-loop, and the loop stays idle."""
    roomy = engine.pools
    engine.pools = [type(roomy[0])(4)]
    try:
        with HostLoop(engine, GREEDY, jax.random.key(0)) as loop:
            with pytest.raises(ValueError, match=r"num_pages = 4: 3 usable .* 6-token prompt need 4 pages"):
                loop.admit([record([1, 2, 3, 4, 5, 6], 0)])
            assert not loop.busy and engine.pools[0].in_use == 0
            loop.admit([record([1, 2, 3, 4, 5], 1)])  # 3 pages: it fits, and runs
            while loop.busy:
                loop.step()
    finally:
        engine.pools = roomy
