"""Multi-turn episodes decode only what they keep (issue #44, item 5).

On the paged engine each turn's request carries its own token limit and its environment's
stop strings (rl_core.rollout.backend.Requests), the engine stops each sequence there, and
only the live rows reach it; the episodes keep exactly what they kept when every turn was
decoded to max_new_tokens on padded rows (the "old" path, `row_limits=False`), and the
metrics tell decoded (`perf/generated_tokens`) from kept (`perf/kept_tokens`) tokens.

And a turn continues from its episode's cached prefix: a row with a session handle leaves its
sequence's pages in the engine when it ends (rl_core.rollout.retained), and the next turn's
prompt (the whole history) prefills only what follows the part the engine still holds. The
tokens and log-probs are those of prefilling the whole history again, which the engine does
itself when a dry pool took the held pages back; every page is free once the episodes end.
"""

import dataclasses
import itertools

import jax
import numpy as np
import pytest
import rewards
import rl_models
from flax import nnx
from rl_core import registry
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.episodes import EpisodeLimits, StepResult, register_environment, run_episodes
from rl_core.rollout.backend import Requests, stop_index
from rl_core.rollout.pages import PagePool
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.retained import Retained
from rl_core.rollout.sampler import SamplingParams
from rl_core.policy.tokens import left_pad
from tolerances import approx, close

TOK = rl_models.CharTokenizer()
T = 32  # the episode budget, the engine's max_new_tokens
K = 4  # decode steps per device call: a stop string is seen at most K - 1 tokens late
LIMITS = EpisodeLimits(max_turns=3, max_turn_tokens=10, max_tokens=T, max_prompt_tokens=10)
SAMPLING = SamplingParams(temperature=1.0)
STOPS = ("e", "t", "a", "o", "9")  # common characters of the tiny random model: some turns stop, some do not
PROMPTS = [Prompt("12*3="), Prompt("7+8="), Prompt("100-1=")]


@pytest.fixture(scope="module")
def tiny():
    config = rl_models.TransformerConfig.tiny(TOK.vocab_size, hidden_size=32, num_layers=2, num_heads=2,
                                              num_kv_heads=1, mlp_hidden_size=64)
    return rl_models.Transformer(config, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def engine(tiny):
    graphdef, state = nnx.split(tiny)
    settings = EngineSettings(max_prompt_tokens=LIMITS.max_prompt_tokens + 1 + T, max_new_tokens=T, page_size=4,
                              slots=8, prefill_chunk=16, steps_per_sync=K)
    backend = PagedBackend(graphdef, settings, paging=rl_models.PAGED_TRANSFORMER, eos_ids=TOK.eos_ids,
                           pad_id=TOK.pad_id)
    backend.update_weights(state, 0)
    return backend


class StopEnv:
    """A scripted environment: a fixed observation after every turn, never done itself; turns stop at STOPS."""

    stop_strings = STOPS

    def __init__(self) -> None:
        self.state = {"turns": 0}

    def reset(self, prompt):
        self.state = {"turns": 0}
        return ""

    def step(self, text):
        self.state = {"turns": self.state["turns"] + 1}
        return StepResult("[ok]", 0.5, False)


class Calls:
    """`run_episodes`' generate over the paged engine (call n samples with fold_in(key, n)), recording
    each call's rows, limits and lengths."""

    def __init__(self, engine, seed=0):
        self.engine, self.key, self.calls, self.log = engine, jax.random.key(seed), itertools.count(), []

    def __call__(self, tokens, mask, n, max_new_tokens=None, stop_strings=None, sessions=None):
        requests = Requests(tokens, mask, n, max_new_tokens=max_new_tokens, stop_strings=stop_strings,
                            decode=TOK.decode, sessions=sessions)
        out = self.engine.generate(requests, SAMPLING, jax.random.fold_in(self.key, next(self.calls)))
        self.log.append({"rows": len(out.lengths), "limits": None if max_new_tokens is None
                         else np.repeat(max_new_tokens, n), "lengths": np.asarray(out.lengths)})
        return out

    @property
    def decoded(self):
        return int(sum(c["lengths"].sum() for c in self.log))


def prompt_rows(lengths=(3, 9, 5, 1, 14), seed=0):
    rng = np.random.default_rng(seed)
    return left_pad([rng.integers(3, TOK.vocab_size, n).tolist() for n in lengths], pad_id=0, max_tokens=16)


def first_stop(tokens, stops):
    """The fewest leading tokens whose text holds a stop string (None if none does)."""
    for k in range(1, len(tokens) + 1):
        if any(s in TOK.decode(tokens[:k]) for s in stops):
            return k
    return None


def test_stop_index_asks_for_the_token_after_a_stop():
    ids = TOK.encode("xa</c>y")
    assert stop_index(ids[:5], ("</c>",), TOK.decode) is None
    assert stop_index(ids[:6], ("</c>",), TOK.decode) == 7  # the stop ends at the last token: one more
    assert stop_index(ids[:7], ("</c>",), TOK.decode) == 7  # the stop ended before it: stop now
    assert stop_index(ids, (), TOK.decode) is None


def test_the_engine_stops_each_row_at_its_limit_and_stop_strings_and_decodes_the_same_tokens(engine):
    tokens, mask = prompt_rows()
    key = jax.random.key(5)
    full = engine.generate(Requests(tokens, mask, 2), SAMPLING, key)
    limits = np.array([3, 11, T, 1, 7])
    stops = [STOPS, (), STOPS, ("zz",), ("e",)]
    cut = engine.generate(Requests(tokens, mask, 2, max_new_tokens=limits, stop_strings=stops, decode=TOK.decode),
                          SAMPLING, key)
    ended_by = {"limit": 0, "stop": 0}
    for row in range(len(cut.lengths)):
        limit, row_stops = limits[row // 2], stops[row // 2]
        n, whole = int(cut.lengths[row]), int(full.lengths[row])
        # the same tokens and log-probs as without limits, up to where it stopped
        np.testing.assert_array_equal(cut.tokens[row, :n], full.tokens[row, :n])
        np.testing.assert_allclose(cut.logp[row, :n], full.logp[row, :n], **close(rtol=1e-6, atol=1e-6))
        assert (cut.tokens[row, n:] == TOK.pad_id).all() and (cut.mask[row, n:] == 0).all()
        stop = first_stop(full.tokens[row, :whole].tolist(), row_stops)
        if stop is not None and stop < min(limit, whole):
            # one token past the stop (an EOS there is kept), at most K - 1 more: seen between calls
            assert stop + 1 <= n <= min(stop + K, limit, whole)
            ended_by["stop"] += 1
        else:
            assert n == min(limit, whole)
            ended_by["limit"] += n == limit < whole
    assert ended_by["stop"] and ended_by["limit"]  # both kinds of end happen


def run(engine, row_limits, seed=0, num_samples=2, sessions=False):
    generate = Calls(engine, seed)
    out = run_episodes(generate, TOK, PROMPTS, StopEnv, num_samples=num_samples, limits=LIMITS,
                       row_limits=row_limits, sessions=engine if sessions else None)
    return out, generate


def test_episodes_keep_what_they_kept_and_decode_only_that(engine):
    old, old_calls = run(engine, row_limits=False)
    new, new_calls = run(engine, row_limits=True)
    # the kept tokens, log-probs, masks and records are those of the old path
    np.testing.assert_array_equal(new.completions.tokens, old.completions.tokens)
    np.testing.assert_array_equal(new.completions.mask, old.completions.mask)
    np.testing.assert_allclose(new.completions.logp, old.completions.logp, **close(rtol=1e-6, atol=1e-6))
    np.testing.assert_array_equal(new.completions.truncated, old.completions.truncated)
    assert new.episodes == old.episodes and new.texts == old.texts
    turns = [t for e in new.episodes for role, t in e.turns if role == "model"]
    assert any(any(t.endswith(s) for s in STOPS) for t in turns)  # turns cut at a stop string
    assert any(not any(s in t for s in STOPS) for t in turns)  # and turns that ran to their limit
    assert any(e.truncated for e in new.episodes) or any(len(e.turns) == 5 for e in new.episodes)

    kept = int(new.completions.lengths.sum())
    assert old.decoded_tokens == old_calls.decoded and new.decoded_tokens == new_calls.decoded
    # the old path: every turn to max_new_tokens or an EOS, rows padded to a power of two
    assert [c["rows"] for c in old_calls.log][1:] == [8] * (len(old_calls.log) - 1)  # 6 live rows padded to 8
    old_ratio, new_ratio = old.decoded_tokens / kept, new.decoded_tokens / kept
    # only the live rows reach the engine, each decoded to its own limit, a stop seen at most K - 1 late
    live = [len(old.episodes)] + [sum(sum(r == "model" for r, _ in e.turns) > t for e in new.episodes)
                                      for t in range(1, LIMITS.max_turns)]
    assert [c["rows"] for c in new_calls.log] == live[: len(new_calls.log)]
    for call in new_calls.log:
        assert (call["lengths"] <= call["limits"]).all()
    assert kept <= new.decoded_tokens <= kept + (K - 1 + 1) * sum(live)
    assert old_ratio > 3 and new_ratio < 1.2, (old_ratio, new_ratio)  # measured: 599 / 136 = 4.4, 147 / 136 = 1.08


def length(prompts, completions, **_):
    return [float(len(c)) for c in completions]


def test_the_step_metrics_tell_decoded_from_kept_tokens(tiny):
    register_environment("test-stop-env", StopEnv)
    algorithm = registry.get_algorithm("grpo")
    rollout = RolloutConfig(max_prompt_tokens=LIMITS.max_prompt_tokens, max_new_tokens=T, engine="paged",
                            environment="test-stop-env", max_turns=LIMITS.max_turns,
                            max_turn_tokens=LIMITS.max_turn_tokens,
                            options={"page_size": 4, "steps_per_sync": K, "prefill_chunk": 16, "slots": 8})
    learner = algorithm.learner(
        dataclasses.replace(algorithm.config(), group_size=2), policy=tiny, tokenizer=TOK, train_data=PROMPTS * 4,
        training=TrainingConfig(prompts_per_step=2, num_steps=1, checkpoint_every_steps=0),
        rollout=rollout, reward_manager=rewards.RewardManager([length]),
        paging=rl_models.PAGED_TRANSFORMER,
    )
    returned = []
    backend_generate = learner.generator.backend.generate

    def counting(requests, sampling, key):
        out = backend_generate(requests, sampling, key)
        returned.append(int(np.asarray(out.lengths).sum()))
        return out

    learner.generator.backend.generate = counting
    groups, _ = learner._collect(PROMPTS[:2], learner.supply())
    metrics = learner._examples_from(groups).metrics
    assert metrics["perf/generated_tokens"] == sum(returned)  # what the engine decoded
    assert metrics["perf/kept_tokens"] == groups.lengths.sum()  # what the episodes kept
    assert metrics["perf/decoded_per_kept"] == approx(sum(returned) / groups.lengths.sum())
    assert 1.0 <= metrics["perf/decoded_per_kept"] < 1.5
    # later turns continued their episodes' cached sequences (the tests below),
    # released when the episodes ended
    assert metrics["perf/reused_prefix_tokens"] > metrics["perf/prefill_tokens"] > 0
    assert learner.generator.backend.pools[0].in_use == 0 and not learner.generator.backend.retained.held


# -- a turn continues from its cached prefix ---------------------------------------------------


def ids_of(*lengths):
    rng = np.random.default_rng(0)
    return [rng.integers(3, TOK.vocab_size, n).tolist() for n in lengths]


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
    store.keep(5, 0, tokens[:9], pages, pool, 4)  # 9 tokens need all 3 pages
    assert pool.in_use == 3 and store.pages_on(0) == 3
    # the new prompt parts from the held tokens at position 5: pages 0-1 kept, page 2 freed
    prompt = np.concatenate([tokens[:5], [99, 98, 97]])
    got, reused, _ = store.take(5, 0, prompt, len(prompt) - 1, pool, 4)
    assert (got, reused) == (pages[:2], 5) and pool.in_use == 2 and not store.held
    pool.release(got)
    # a shared page at the parting (another sequence of the prompt holds it): never written, the
    # prefill restarts at its first position
    pages = pool.allocate(3)
    pool.retain(pages[:2])
    store.keep(6, 0, tokens[:9], pages, pool, 4)
    got, reused, _ = store.take(6, 0, prompt, len(prompt) - 1, pool, 4)
    assert (got, reused) == (pages[:1], 4)
    # a prompt that is the held sequence and more: every held position reused, at most its prefix
    store.keep(7, 0, tokens[:6], [*got, *pool.allocate(1)], pool, 4)
    got, reused, _ = store.take(7, 0, tokens, 9, pool, 4)
    assert reused == 6 and len(got) == 2
    assert store.take(7, 0, tokens, 9, pool, 4) == ([], 0, 0)  # taken: nothing held any more


def test_retained_state_rows_are_reused_only_by_a_prompt_continuing_the_whole_sequence():
    """A recurrent state cannot rewind: the held row (and with it the pages) serves a prompt that
    continues all the held tokens; one parting earlier gets nothing, the row and pages freed."""
    pool, rows, store = PagePool(9), PagePool(4), Retained()
    tokens = np.arange(10, 20, dtype=np.int32)
    pages, row = pool.allocate(2), rows.allocate(1)[0]
    store.keep(1, 0, tokens[:6], pages, pool, 4, rows, row)
    assert store.rows_on(0) == 1
    assert store.take(1, 0, tokens, 9, pool, 4, rows) == (pages, 6, row)  # all 6 held tokens continue
    assert rows.in_use == 1 and pool.in_use == 2  # now the prompt's
    store.keep(2, 0, tokens[:6], pages, pool, 4, rows, row)
    parted = np.concatenate([tokens[:5], [99, 98, 97]])  # parts at position 5, inside the held tokens
    assert store.take(2, 0, parted, 7, pool, 4, rows) == ([], 0, 0)
    assert rows.in_use == 0 and pool.in_use == 0


def test_a_continued_turn_prefills_only_past_what_it_shares_and_samples_as_a_full_prefill(engine):
    prompts, g = ids_of(3, 9, 5), 2
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
    np.testing.assert_allclose(continued.logp, again.logp, **close(rtol=1e-6, atol=1e-6))
    assert empty(engine)


def episodes(engine, sessions, seed=0):
    return counted(engine, lambda: run(engine, row_limits=True, seed=seed, sessions=sessions)[0])


def assert_same_episodes(got, want):
    np.testing.assert_array_equal(got.completions.tokens, want.completions.tokens)
    np.testing.assert_array_equal(got.completions.mask, want.completions.mask)
    np.testing.assert_allclose(got.completions.logp, want.completions.logp, **close(rtol=1e-6, atol=1e-6))
    assert got.episodes == want.episodes and got.texts == want.texts


def test_episodes_continuing_their_sequences_equal_episodes_prefilling_their_histories(engine):
    whole, (whole_prefill, none) = episodes(engine, sessions=False)
    cached, (cached_prefill, reused) = episodes(engine, sessions=True)
    assert empty(engine)  # every episode released its sequence
    assert_same_episodes(cached, whole)
    turns = [t for e in whole.episodes for role, t in e.turns if role == "model"]
    assert len(turns) > len(PROMPTS) * 2 and any(t.endswith(STOPS) for t in turns)  # later turns; cut ones
    assert none == 0 and whole_prefill == cached_prefill + reused  # the same prompts, the prefix now reused
    assert reused > 2 * cached_prefill, (whole_prefill, cached_prefill, reused)  # measured: 295 = 61 + 234


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


def test_sessions_are_checked_and_every_held_page_is_freed_on_an_exception_or_new_weights(engine, tiny):
    tokens, mask = left_pad(ids_of(3, 9, 5), pad_id=0, max_tokens=16)
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
    engine.update_weights(nnx.split(tiny)[1], 1)  # as new weights: the held keys and values would be stale
    assert empty(engine)
