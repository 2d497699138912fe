"""What a paged engine's per-sequence state rows must keep, for any model that holds them
(Qwen3.5's linear-attention states, a mixed windowed model's KV rings): a retained session's next
turn continues from its held rows, and a weight switch mid-rollout keeps (`continue`) or rebuilds
(`recompute`) them. The two scenarios, shared by the tests of each such model."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_core.policy.logprobs import completion_logprobs
from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Requests
from rl_core.rollout.sampler import GREEDY, SamplingParams
from engines import full_forward_greedy, paged_engine


T = 12
"""New tokens a completion takes."""
SMALL = dict(max_prompt_tokens=16, max_new_tokens=T, page_size=4, slots=3, prefill_chunk=8, steps_per_sync=3)
"""A small engine: 4-token pages, 3 slots, 8-token prefill chunks."""
NO_EOS = (10_000,)  # outside the vocabulary: every completion runs T tokens


def small_engine(model: Any, partial: str = "off", **overrides: Any) -> Any:
    """A paged engine of SMALL (with `overrides`) holding `model`, no EOS, partial rollouts `partial`."""
    return paged_engine(model, SMALL | overrides, eos_ids=NO_EOS, partial_rollouts=partial)


def prompts(lengths=(3, 14, 9, 1), seed=0) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded random prompts (tokens 3..299) of `lengths`, 16 slots wide."""
    rng = np.random.default_rng(seed)
    return left_pad([rng.integers(3, 300, n).tolist() for n in lengths], pad_id=0, max_tokens=16)


def learner_logprobs(model: Any, tokens: Any, mask: Any, completions: Any, temperature: float = 1.0) -> np.ndarray:
    """[B, T] the learner's log-probs of `completions` (the full forward's scoring pass)."""
    logp, _ = jax.jit(lambda m: completion_logprobs(m, jnp.asarray(tokens), jnp.asarray(mask),
                                                    jnp.asarray(completions), temperature=temperature))(model)
    return np.asarray(logp)


def perturbed(model: Any, scale: float = 0.05, seed: int = 1) -> Any:
    """`model`'s weights plus noise: the second weight version of a partial rollout."""
    graphdef, state = nnx.split(model)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys, strict=True)]
    return nnx.merge(graphdef, jax.tree.unflatten(tree, noisy))


def check_retained_session(model: Any, engine: Any, *, atol: float) -> None:
    """Turn 2 sends turn 1's prompt, its completion and an observation under the same handles: the
    engine prefills only the observation (from the held pages and state rows) and generates what
    the full forward predicts; a prompt that departs from the held tokens is prefilled whole
    (held rows cannot rewind); every page and row is free after `release()`."""
    tokens, mask = prompts((5, 9))
    handles = engine.new_sessions(2)
    first = engine.generate(Requests(tokens, mask, sessions=handles), GREEDY, jax.random.key(0))
    assert engine.retained.rows_on(0) == 2
    rng = np.random.default_rng(1)
    turns = [np.concatenate([tokens[i][mask[i] > 0], first.tokens[i], rng.integers(3, 300, 3)]).tolist()
             for i in range(2)]
    tokens2, mask2 = left_pad(turns, pad_id=0, max_tokens=32)
    before = engine.prefill_tokens
    second = engine.generate(Requests(tokens2, mask2, sessions=handles), GREEDY, jax.random.key(0))
    # held: each prompt and its completion but the last token; prefilled: that token and the observation's first 2
    assert engine.prefill_tokens - before == 2 * 3
    np.testing.assert_array_equal(second.tokens, full_forward_greedy(model, tokens2, mask2, second.tokens))
    np.testing.assert_allclose(second.logp, learner_logprobs(model, tokens2, mask2, second.tokens), atol=atol)
    turns[0][-4] = turns[0][-4] % 290 + 5  # a third turn rewrites the last completion's end: nothing reused
    tokens3, mask3 = left_pad(turns, pad_id=0, max_tokens=32)
    third = engine.generate(Requests(tokens3, mask3, sessions=handles), GREEDY, jax.random.key(0))
    np.testing.assert_array_equal(third.tokens, full_forward_greedy(model, tokens3, mask3, third.tokens))
    engine.release()
    assert engine.state_pools[0].in_use == 0 and engine.pools[0].in_use == 0


def check_weight_switch(model: Any, make_engine: Callable[[Any, str], Any], mode: str, *, atol: float) -> None:
    """New weights published after call 2 of `make_engine(model, mode)`'s generation: the tokens
    before are the old weights' alone; with `recompute` the tokens after are the new weights' own
    forward (every row and page rebuilt from the tokens), with `continue` they differ from it (the
    rows running at the switch continue from what the old weights wrote)."""
    tokens, mask = prompts()
    new = perturbed(model)
    engine = make_engine(model, mode)
    engine.update_weights(nnx.split(model)[1], 0)
    alone = engine.generate(Requests(tokens, mask), SamplingParams(temperature=1.0), jax.random.key(4))
    call, calls = type(engine).call.__get__(engine), [0]

    def publishing(*args):
        out = call(*args)
        calls[0] += 1
        if calls[0] == 2:
            engine.feed.publish(1, nnx.split(new)[1])
        return out

    engine.call = publishing
    got = engine.generate(Requests(tokens, mask), SamplingParams(temperature=1.0), jax.random.key(4))
    assert engine.switches == 1
    old = got.token_version == 0
    assert old.any() and (~old).any()
    np.testing.assert_array_equal(got.tokens[old], alone.tokens[old])
    np.testing.assert_allclose(got.logp[old], learner_logprobs(model, tokens, mask, got.tokens)[old], atol=atol)
    new_logp = learner_logprobs(new, tokens, mask, got.tokens)
    if mode == "recompute":
        np.testing.assert_allclose(got.logp[~old], new_logp[~old], atol=atol)
    else:
        assert np.abs(got.logp[~old] - new_logp[~old]).max() > 1e-3
    assert engine.state_pools[0].in_use == 0 and engine.pools[0].in_use == 0


def check_small_pools(engine: Any, data: Any, *, longest_prompt: int) -> None:
    """Under random small host pools of pages and of state rows drawn from hypothesis `data` (the
    device pools stay roomy; the host ones limit what the scheduler hands out), prompts of 1 to
    `longest_prompt` tokens, 1 to 3 samples each and EOS-driven lengths: the completions of a
    roomy engine, and every page and row free."""
    from hypothesis import strategies as st

    from rl_core.rollout.pages import PagePool
    from rl_core.rollout.scheduler import pages_for_one

    s = engine.settings
    lengths = data.draw(st.lists(st.integers(1, longest_prompt), min_size=1, max_size=4), label="prompt lengths")
    samples = data.draw(st.integers(1, 3), label="samples per prompt")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="prompt seed"))
    reqs = Requests(*left_pad([rng.integers(6, 300, n).tolist() for n in lengths], pad_id=0, max_tokens=16),
                    num_samples=samples)
    key = jax.random.key(data.draw(st.integers(0, 2**16), label="key"))
    one = max(pages_for_one(s.page_size, n, s.max_new_tokens) for n in lengths)
    pages = data.draw(st.integers(one + 1, one + 1 + 2 * s.slots), label="pool pages")
    rows = data.draw(st.integers(3, s.state_pool_rows), label="state rows")
    engine.pools, engine.state_pools = [PagePool(s.pool_pages)], [PagePool(s.state_pool_rows)]
    want = engine.generate(reqs, SamplingParams(temperature=1.0), key)
    engine.pools, engine.state_pools = [PagePool(pages)], [PagePool(rows)]
    got = engine.generate(reqs, SamplingParams(temperature=1.0), key)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.lengths, want.lengths)
    # chunks hold other prompts when the pool is scarce (rings share chunks): another summation order
    np.testing.assert_allclose(got.logp, want.logp, rtol=1e-6, atol=1e-6)
    assert engine.pools[0].in_use == 0 and engine.state_pools[0].in_use == 0


def fuzz_engine(model: Any) -> Any:
    """One engine for every example of `check_small_pools` (its programs compiled once): SMALL with
    2 slots and 8 new tokens; EOS is 14 of the ids (6..19), so completions end at mixed lengths."""
    return paged_engine(model, SMALL | dict(max_new_tokens=8, slots=2), eos_ids=tuple(range(6, 20)))
