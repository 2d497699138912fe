"""A multi-turn episode's turn continues from its cached prefix on the paged engine (issue #44, item 5).

A row with a session handle leaves its sequence's pages in the engine when it ends
(rl_core.rollout.retained); the next turn's prompt (the whole history) prefills only
what follows the part the engine still holds. The tokens and log-probs are those of
prefilling the whole history again, which the engine does itself when a dry pool took
the held pages back; every page is free once the episodes are released.
"""

import jax
import numpy as np
import pytest
import rl_models
from flax import nnx
from rl_core.data import Prompt
from rl_core.episodes import EpisodeLimits, StepResult, run_episodes
from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Requests
from rl_core.rollout.pages import PagePool
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.retained import Retained
from rl_core.rollout.sampler import SamplingParams

TOK = rl_models.CharTokenizer()
T = 32
K = 4
LIMITS = EpisodeLimits(max_turns=3, max_turn_tokens=10, max_tokens=T, max_prompt_tokens=10)
SAMPLING = SamplingParams(temperature=1.0)
STOPS = ("e", "t", "a", "o", "9")  # common characters of the tiny random model: some turns are cut
PROMPTS = [Prompt("12*3="), Prompt("7+8="), Prompt("100-1=")]
PS = 4


@pytest.fixture(scope="module")
def model():
    config = rl_models.TransformerConfig.tiny(TOK.vocab_size, hidden_size=32, num_layers=2, num_heads=2,
                                              num_kv_heads=1, mlp_hidden_size=64)
    return nnx.split(rl_models.Transformer(config, rngs=nnx.Rngs(0)))


@pytest.fixture(scope="module")
def engine(model):
    """The engine of test_core_episode_decoding (the same programs)."""
    graphdef, state = model
    settings = EngineSettings(max_prompt_tokens=LIMITS.max_prompt_tokens + 1 + T, max_new_tokens=T, page_size=PS,
                              slots=8, prefill_chunk=16, steps_per_sync=K)
    backend = PagedBackend(graphdef, settings, paging=rl_models.PAGED_TRANSFORMER, eos_ids=TOK.eos_ids,
                           pad_id=TOK.pad_id)
    backend.update_weights(state, 0)
    return backend


def empty(engine):
    return all(pool.in_use == 0 for pool in engine.pools) and not engine.retained.held


def counted(engine, fn):
    """fn()'s result and the (prefilled, reused) prompt tokens it cost the engine."""
    before = engine.prefill_tokens, engine.reused_tokens
    out = fn()
    return out, (engine.prefill_tokens - before[0], engine.reused_tokens - before[1])


def test_retained_take_keeps_the_common_prefix_and_frees_the_pages_past_it():
    pool, store = PagePool(9), Retained()
    pages = pool.allocate(3)
    tokens = np.arange(10, 20, dtype=np.int32)  # 10 positions in 3 pages of 4
    store.keep(5, 0, tokens[:9], pages, pool, PS)  # 9 tokens need all 3 pages
    assert pool.in_use == 3 and store.pages_on(0) == 3
    # the new prompt parts from the held tokens at position 5: pages 0-1 kept, page 2 freed
    prompt = np.concatenate([tokens[:5], [99, 98, 97]])
    got, reused = store.take(5, 0, prompt, len(prompt) - 1, pool, PS)
    assert (got, reused) == (pages[:2], 5) and pool.in_use == 2 and not store.held
    pool.release(got)
    # a shared page at the parting (another sequence of the prompt holds it): never written, the
    # prefill restarts at its first position
    pages = pool.allocate(3)
    pool.retain(pages[:2])
    store.keep(6, 0, tokens[:9], pages, pool, PS)
    got, reused = store.take(6, 0, prompt, len(prompt) - 1, pool, PS)
    assert (got, reused) == (pages[:1], 4)
    # a prompt that is the held sequence and more: every held position reused, at most its prefix
    store.keep(7, 0, tokens[:6], [*got, *pool.allocate(1)], pool, PS)
    got, reused = store.take(7, 0, tokens, 9, pool, PS)
    assert reused == 6 and len(got) == 2
    assert store.take(7, 0, tokens, 9, pool, PS) == ([], 0)  # taken: nothing held any more


def prompt_rows(lengths=(3, 9, 5)):
    rng = np.random.default_rng(0)
    return [rng.integers(3, TOK.vocab_size, n).tolist() for n in lengths]


def test_a_continued_turn_prefills_only_past_what_it_shares_and_samples_as_a_full_prefill(engine):
    prompts, g = prompt_rows(), 2
    handles = engine.new_sessions(len(prompts) * g)
    first = engine.generate(Requests(*left_pad(prompts, pad_id=0, max_tokens=16), g, sessions=handles),
                            SAMPLING, jax.random.key(1))
    assert engine.pools[0].in_use == engine.retained.pages_on(0) > 0  # held, the rest freed
    history, expect = [], 0
    for row in range(len(prompts) * g):
        prompt, n = prompts[row // g], int(first.lengths[row])
        keep = [n, n - 1, 1][row % 3]  # all, all but one, one: a turn cut short drops held positions
        following = int(first.tokens[row, keep]) if keep < n else -1
        observation = [t for t in (7, 8, 9) if t != following][: row % 3]  # 0 to 2 new tokens
        history.append(prompt + first.tokens[row, :keep].tolist() + observation)
        # held: the prompt and every sampled token but the last; shared with the history up to `keep`
        expect += min(len(prompt) + n - 1, len(prompt) + keep, len(history[-1]) - 1)
    tokens, mask = left_pad(history, pad_id=0, max_tokens=T + 16)
    key = jax.random.key(2)
    continued, (prefilled, reused) = counted(engine, lambda: engine.generate(
        Requests(tokens, mask, 1, sessions=handles), SAMPLING, key))
    assert reused == expect and prefilled == sum(len(h) - 1 for h in history) - expect
    engine.release(handles)
    assert empty(engine)

    again, (prefilled, reused) = counted(engine, lambda: engine.generate(Requests(tokens, mask, 1), SAMPLING, key))
    assert reused == 0 and prefilled == sum(len(h) - 1 for h in history)
    np.testing.assert_array_equal(continued.tokens, again.tokens)
    np.testing.assert_array_equal(continued.lengths, again.lengths)
    np.testing.assert_allclose(continued.logp, again.logp, rtol=1e-6, atol=1e-6)
    assert empty(engine)


class StopEnv:
    """Turns stop at STOPS; the observation names the turn, so episodes' histories differ."""

    stop_strings = STOPS

    def __init__(self) -> None:
        self.state = {"turns": 0}

    def reset(self, prompt):
        self.state = {"turns": 0}
        return ""

    def step(self, text):
        self.state = {"turns": self.state["turns"] + 1}
        return StepResult(f"[{self.state['turns']}{len(text)}]", 0.5, False)


class Generate:
    """`run_episodes`' generate over the engine: call n samples with fold_in(key, n)."""

    def __init__(self, engine, seed=0):
        self.engine, self.key, self.n = engine, jax.random.key(seed), 0

    def __call__(self, tokens, mask, n, max_new_tokens=None, stop_strings=None, sessions=None):
        requests = Requests(tokens, mask, n, max_new_tokens=max_new_tokens, stop_strings=stop_strings,
                            decode=TOK.decode, sessions=sessions)
        self.n += 1
        return self.engine.generate(requests, SAMPLING, jax.random.fold_in(self.key, self.n - 1))


def episodes(engine, sessions, seed=0):
    return counted(engine, lambda: run_episodes(Generate(engine, seed), TOK, PROMPTS, StopEnv, num_samples=2,
                                                limits=LIMITS, row_limits=True,
                                                sessions=engine if sessions else None))


def assert_same_episodes(got, want):
    np.testing.assert_array_equal(got.completions.tokens, want.completions.tokens)
    np.testing.assert_array_equal(got.completions.mask, want.completions.mask)
    np.testing.assert_allclose(got.completions.logp, want.completions.logp, rtol=1e-6, atol=1e-6)
    assert got.episodes == want.episodes and got.texts == want.texts


def test_episodes_continuing_their_sequences_equal_episodes_prefilling_their_histories(engine):
    whole, (whole_prefill, none) = episodes(engine, sessions=False)
    cached, (cached_prefill, reused) = episodes(engine, sessions=True)
    assert empty(engine)  # every episode released its sequence
    assert_same_episodes(cached, whole)
    turns = [t for e in whole.episodes for role, t in e.turns if role == "model"]
    assert len(turns) > len(PROMPTS) * 2 and any(t.endswith(STOPS) for t in turns)  # later turns; cut ones
    assert none == 0 and whole_prefill == cached_prefill + reused  # the same prompts, the prefix now reused
    assert reused > 2 * cached_prefill, (whole_prefill, cached_prefill, reused)  # measured: 300 = 66 + 234


def test_a_dry_pool_takes_retained_sequences_back_first_and_the_episodes_stay_the_same(engine):
    want, _ = episodes(engine, sessions=True, seed=3)
    roomy = engine.pools
    evictions = engine.evictions
    engine.pools = [PagePool(40)]  # 39 pages: the held sequences of 6 episodes and their next turns do not fit
    try:
        got, (prefilled, reused) = episodes(engine, sessions=True, seed=3)
        assert empty(engine)
    finally:
        engine.pools = roomy
    assert engine.evictions > evictions and reused > 0
    assert_same_episodes(got, want)


def test_sessions_are_checked_and_every_held_page_is_freed_on_an_exception_or_new_weights(engine, model):
    tokens, mask = left_pad(prompt_rows(), pad_id=0, max_tokens=16)
    with pytest.raises(ValueError, match=r"sessions has shape \(3,\); expected \(6,\)"):
        engine.generate(Requests(tokens, mask, 2, sessions=np.arange(3)), SAMPLING, jax.random.key(0))
    with pytest.raises(ValueError, match=r"sessions names a handle for two rows: \[1, 1, 2\]"):
        engine.generate(Requests(tokens, mask, 1, sessions=np.array([1, 1, 2])), SAMPLING, jax.random.key(0))
    handles = engine.new_sessions(3)
    engine.generate(Requests(tokens, mask, 1, sessions=handles), SAMPLING, jax.random.key(0))
    with pytest.raises(ValueError, match=r"prompt 0 continues the sequence held under handle .* with 2 samples"):
        engine.generate(Requests(tokens, mask, 2, sessions=np.concatenate([handles, handles + 100])), SAMPLING,
                        jax.random.key(0))
    assert empty(engine)  # a failed rollout keeps nothing

    engine.generate(Requests(tokens, mask, 1, sessions=handles), SAMPLING, jax.random.key(0))
    assert engine.retained.held
    call = engine.call

    def failing(*args):
        raise KeyboardInterrupt("interrupted mid-rollout")

    engine.call = failing
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.generate(Requests(tokens, mask, 1, sessions=handles), SAMPLING, jax.random.key(0))
    finally:
        engine.call = call
        del engine.call
    assert empty(engine)

    engine.generate(Requests(tokens, mask, 1, sessions=handles), SAMPLING, jax.random.key(0))
    assert engine.retained.held
    engine.update_weights(model[1], 1)  # as new weights: the held keys and values would be stale
    assert empty(engine)
