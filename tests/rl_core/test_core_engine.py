"""The paged rollout engine (rl_core.rollout.paged) against the static sampler and the learner.

Engines here are deliberately cramped (3 slots, 4-token pages, 8-token prefill
chunks, 3 steps per call) so that one rollout refills slots, spreads prompts
over several chunks and page boundaries, and shares and frees pages.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.runtime.compiles import compile_count
from rl_core.policy.logprobs import completion_logprobs
from rl_core.rollout.backend import Requests, RolloutBackend
from rl_core.rollout.paged import PagedBackend
from rl_core.rollout.static import StaticBackend
from rl_core.rollout.sampler import GREEDY, SamplingParams
from rl_core.policy.tokens import left_pad
from rl_models.hf import load_hf_model
from engines import paged_engine, static_engine
from host import about_the_cpu
from tolerances import close

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
T = 12
PROMPT_LENGTHS = (3, 9, 5, 1, 14)  # 1: no prefix to prefill; 9, 14: prefixes over page and chunk borders
SMALL = dict(max_prompt_tokens=16, max_new_tokens=T, page_size=4, slots=3, prefill_chunk=8, steps_per_sync=3)


@pytest.fixture(scope="module", params=["qwen2", "llama3"])
def model(request):
    return load_hf_model(HF / request.param)


def prompts(lengths=PROMPT_LENGTHS, seed=0):
    rng = np.random.default_rng(seed)
    ids = [rng.integers(3, 300, n).tolist() for n in lengths]
    return left_pad(ids, pad_id=0, max_tokens=16)


def paged(model, eos_ids, **overrides) -> PagedBackend:
    return paged_engine(model, SMALL | overrides, eos_ids=eos_ids, version=7)


def static(model, eos_ids) -> StaticBackend:
    return static_engine(model, max_new_tokens=T, eos_ids=eos_ids, version=7)


def eos_at_mixed_steps(model) -> tuple[int]:
    """An EOS id that the greedy completions first emit at several different steps."""
    tokens = np.asarray(static(model, (301,)).generate(Requests(*prompts()), GREEDY, jax.random.key(0)).tokens)
    for candidate in np.unique(tokens):
        first = [int(np.argmax(row == candidate)) for row in tokens if (row == candidate).any()]
        if len(set(first)) >= 2 and len(first) < len(tokens):
            return (int(candidate),)
    raise AssertionError("no token of the greedy completions ends them at mixed steps")


def test_both_backends_follow_the_protocol(model):
    assert isinstance(paged(model, (301,)), RolloutBackend)
    assert isinstance(static(model, (301,)), RolloutBackend)


def test_greedy_paged_equals_static_token_for_token(model):
    eos = eos_at_mixed_steps(model)
    requests = Requests(*prompts(), num_samples=2)
    want = static(model, eos).generate(requests, GREEDY, jax.random.key(0))
    got = paged(model, eos).generate(requests, GREEDY, jax.random.key(0))
    lengths = np.asarray(want.lengths)
    assert len(set(lengths.tolist())) >= 3 and (lengths < T).any() and (lengths == T).any()  # mixed, some truncated
    np.testing.assert_array_equal(got.tokens, np.asarray(want.tokens))
    np.testing.assert_array_equal(got.lengths, lengths)
    np.testing.assert_array_equal(got.mask, np.asarray(want.mask))
    np.testing.assert_array_equal(got.truncated, np.asarray(want.truncated))
    np.testing.assert_allclose(got.logp, np.asarray(want.logp), **close(atol=1e-5))
    np.testing.assert_array_equal(got.version, [7] * len(lengths))
    np.testing.assert_array_equal(want.version, [7] * len(lengths))


SAMPLED = SamplingParams(temperature=0.8, top_k=50)


def test_sampled_completions_do_not_depend_on_the_batch(model):
    """The same (prompt id, sample) gives the same completion reordered, mixed with other
    requests, and with fewer slots and a pool so small that sequences are preempted."""
    engine = paged(model, (301,))
    tokens, mask = prompts()
    key = jax.random.key(3)
    alone = engine.generate(Requests(tokens, mask, 3, np.arange(5)), SAMPLED, key)
    assert len({tuple(r) for r in alone.tokens[:3]}) > 1  # samples of a prompt differ
    other_tokens, other_mask = prompts((4, 11, 2), seed=1)
    order = [2, 4, 0, 3, 1]
    mixed_tokens = np.concatenate([other_tokens[:2], tokens[order], other_tokens[2:]])
    mixed_mask = np.concatenate([other_mask[:2], mask[order], other_mask[2:]])
    ids = np.array([10, 11, *order, 12])
    mixed = engine.generate(Requests(mixed_tokens, mixed_mask, 3, ids), SAMPLED, key)
    rows = np.concatenate([np.arange(3) + 3 * (2 + i) for i in range(5)])  # mixed rows of prompts in `order`
    back = np.argsort(np.repeat(order, 3) * 3 + np.tile(np.arange(3), 5), kind="stable")
    np.testing.assert_array_equal(mixed.tokens[rows][back], alone.tokens)
    np.testing.assert_array_equal(mixed.logp[rows][back], alone.logp)

    cramped = paged(model, (301,), slots=2, num_pages=12)
    again = cramped.generate(Requests(tokens, mask, 3, np.arange(5)), SAMPLED, key)
    assert cramped.preemptions > 0
    np.testing.assert_array_equal(again.tokens, alone.tokens)
    np.testing.assert_allclose(again.logp, alone.logp, **close(rtol=1e-6, atol=1e-6))  # 2 slots: another program


def test_engine_logprobs_equal_the_learner_pass(model):
    engine = paged(model, (301,))
    tokens, mask = prompts()
    sampling = SamplingParams(temperature=0.7)
    out = engine.generate(Requests(tokens, mask, 2), sampling, jax.random.key(5))
    logp, _ = jax.jit(lambda p, m, c: completion_logprobs(model, p, m, c, temperature=0.7))(
        np.repeat(tokens, 2, axis=0), np.repeat(mask, 2, axis=0), jnp.asarray(out.tokens)
    )
    # float32 through two different programs (one token at a time over pages vs the whole
    # sequence at once): a few ulps of logits of magnitude ~10, hence rtol as well as atol
    np.testing.assert_allclose(out.logp, np.asarray(logp) * out.mask, **close(rtol=1e-5, atol=1e-5))
    assert out.mask.sum() > 2 * len(tokens)  # real tokens were compared


def test_no_page_leaks_and_prompt_pages_are_shared(model):
    tokens, mask = prompts((14,))
    g = 3
    engine = paged(model, (301,), slots=g, steps_per_sync=1)
    out = engine.generate(Requests(tokens, mask, g), GREEDY, jax.random.key(0))
    assert (out.lengths == T).all()  # the samples run in step to the end, so the peak is known
    assert all(pool.in_use == 0 for pool in engine.pools)
    assert all(engine.pools[0].refcount(p) == 0 for p in range(engine.pools[0].num_pages))
    # prefix of 13 tokens: 3 full pages shared by all samples + 1 partial page copied per sample;
    # each sample then needs its own pages up to position 13 + 11 = 24, i.e. pages 3..6 (4 each)
    assert engine.peak_pages == 4 + g * 4  # unshared prefixes would hold 3 more pages per extra sample


def test_a_pool_too_small_for_one_completion_is_a_clear_error(model):
    engine = paged(model, (301,), num_pages=4)
    engine.call = None  # the error comes before any device call
    # the 14-token prompt: 4 prefix pages, then its own pages for positions 12..24 (4): 8 pages
    with pytest.raises(ValueError, match=r"rollout.options.num_pages = 4: 3 usable .* need 8 pages. "
                                         r"Set rollout.options.num_pages >= 9"):
        engine.generate(Requests(*prompts()), SAMPLED, jax.random.key(0))
    assert engine.pools[0].in_use == 0  # nothing was taken


def test_one_program_per_configuration_and_none_on_a_second_rollout(model):
    engine = paged(model, (301,))
    assert engine.compiles == 1  # the weight refresh
    requests = Requests(*prompts(), num_samples=2)
    engine.generate(requests, SAMPLED, jax.random.key(0))
    assert engine.compiles == 2  # + the step, whatever the number of calls
    before = compile_count()
    engine.generate(Requests(*prompts((7, 2, 12), seed=4), num_samples=3), SAMPLED, jax.random.key(1))
    engine.update_weights(nnx.state(model), 8)
    engine.generate(requests, SAMPLED, jax.random.key(2))
    assert compile_count() == before  # other requests, new weights: nothing compiles
    engine.generate(requests, GREEDY, jax.random.key(0))
    assert engine.compiles == 3  # other sampling parameters: one more program


HLO_TYPES = {"float32": "f32", "bfloat16": "bf16"}


@about_the_cpu("the unrolled layers (one array per layer) are XLA:CPU's layout; accelerators scan a stack")
def test_the_step_reads_each_layers_weights_in_place():
    """Unrolled (CPU), the engine keeps one array per layer, made once per weight version, so its
    step program (called every steps_per_sync tokens) copies no layer's weights out of a stack."""
    model = load_hf_model(HF / "qwen2")
    engine = paged(model, (301,))
    per_layer = jax.tree.leaves(engine.weights["layers"], is_leaf=lambda x: isinstance(x, list))
    assert per_layer and all(isinstance(x, list) and len(x) == model.config.num_layers for x in per_layer)
    text = engine.lower_step(GREEDY, jax.random.key(0)).compile().as_text()
    shapes = {f"{HLO_TYPES[str(x[0].dtype)]}[1,{','.join(map(str, x[0].shape))}]" for x in per_layer}
    sliced = [line for line in text.splitlines() if " slice(" in line and any(f"= {s}" in line for s in shapes)]
    assert sliced == []
    hlo_params = [line for line in text.splitlines() if " parameter(" in line]
    stacked = {f"[{model.config.num_layers},{','.join(map(str, x[0].shape))}]" for x in per_layer}
    assert not [line for line in hlo_params if any(s in line for s in stacked)]  # the stacks are not inputs
