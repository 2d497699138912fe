"""rl_core.rollout.sampler against full recomputation without a KV cache.

The reference decodes greedily by running the model without a cache over
prompt + everything generated so far and taking the argmax at the last
position. It keeps one fixed input width P + T (slots not generated yet hold a
placeholder) so it compiles once: the causal mask from `sequence_inputs`
keeps those slots out of every position at or before the last generated one,
so the logits read at position P + t - 1 are exactly those of the prefix
prompt + generated[:t].
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.policy.logprobs import completion_logprobs, sequence_inputs
from rl_core.rollout import sampler as sampler_module
from rl_core.rollout.sampler import GREEDY, Sampler, SamplingParams, categorical, filter_logits, first_argmax
from rl_core.policy.tokens import left_pad
from rl_models import CharTokenizer, Transformer, TransformerConfig
from rl_models import attention as attention_lib
from rl_models import block as block_lib
from tolerances import close

TOKENIZER = CharTokenizer()
V = TOKENIZER.vocab_size
T = 10  # max_new_tokens
PROMPT_LENGTHS = (3, 8, 5, 1, 6, 2)  # left-padded to the bucket P = 8


@pytest.fixture(scope="module")
def model():
    return Transformer(TransformerConfig.tiny(V), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def prompts():
    """(tokens [B, P], mask [B, P]) of random prompts of different lengths, left-padded."""
    rng = np.random.default_rng(0)
    ids = [rng.integers(3, V, n).tolist() for n in PROMPT_LENGTHS]
    tokens, mask = left_pad(ids, pad_id=TOKENIZER.pad_id, max_tokens=16)
    assert tokens.shape == (len(PROMPT_LENGTHS), 8)
    return jnp.asarray(tokens), jnp.asarray(mask)


@pytest.fixture(scope="module")
def full_logits(model):
    """logits [B, P+T, V] of prompt + completion, computed without any cache (one compile)."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(prompt_tokens, prompt_mask, completion):
        m = nnx.merge(graphdef, state)
        positions, mask = sequence_inputs(prompt_mask, completion.shape[1])
        hidden, cache = m(jnp.concatenate([prompt_tokens, completion], axis=1), positions, mask)
        assert cache is None
        return m.logits(hidden)

    return run


@pytest.fixture(scope="module")
def greedy_reference(prompts, full_logits):
    """Greedy tokens [B, T] by full recomputation at every step."""
    prompt_tokens, prompt_mask = prompts
    p = prompt_tokens.shape[1]
    generated = np.full((prompt_tokens.shape[0], T), TOKENIZER.pad_id, np.int32)  # placeholder slots
    # the placeholders are invisible to the real prompt positions (causal mask); only left-padding
    # queries, which attend to nothing and are never read, see them
    real = np.asarray(prompt_mask) > 0
    a = full_logits(prompt_tokens, prompt_mask, jnp.asarray(generated))[:, :p]
    b = full_logits(prompt_tokens, prompt_mask, jnp.full_like(jnp.asarray(generated), 7))[:, :p]
    np.testing.assert_array_equal(np.asarray(a)[real], np.asarray(b)[real])
    for t in range(T):
        logits = full_logits(prompt_tokens, prompt_mask, jnp.asarray(generated))
        generated[:, t] = np.argmax(np.asarray(logits[:, p + t - 1]), axis=-1)
    return generated


@pytest.fixture(scope="module")
def sampler(model, greedy_reference):
    """A sampler whose EOS id never appears in the greedy reference (every row runs T tokens)."""
    unused = next(i for i in range(3, V) if i not in greedy_reference)
    graphdef, state = nnx.split(model)
    return Sampler(graphdef, max_new_tokens=T, eos_ids=(unused,), pad_id=TOKENIZER.pad_id), state


def test_greedy_with_kv_cache_equals_full_recomputation(sampler, prompts, greedy_reference):
    s, state = sampler
    out = s(state, *prompts, jax.random.key(0), GREEDY)
    np.testing.assert_array_equal(np.asarray(out.tokens), greedy_reference)
    np.testing.assert_array_equal(np.asarray(out.mask), np.ones_like(greedy_reference))
    np.testing.assert_array_equal(np.asarray(out.lengths), [T] * len(PROMPT_LENGTHS))
    assert np.asarray(out.truncated).all()
    # rows differ from one another: the prompts (and their padding) really matter
    assert len({tuple(row) for row in greedy_reference}) > 1


def test_samples_of_a_prompt_share_its_prefill_and_match_repeated_rows(sampler, prompts, greedy_reference):
    s, state = sampler
    n = 3
    shared = s(state, *prompts, jax.random.key(0), GREEDY, num_samples=n)
    # greedy: every sample of prompt i is the reference continuation of prompt i
    np.testing.assert_array_equal(np.asarray(shared.tokens), np.repeat(greedy_reference, n, axis=0))
    # the same as sampling from the prompts repeated row by row, log-probs included
    repeated = s(state, *(jnp.repeat(x, n, axis=0) for x in prompts), jax.random.key(0), GREEDY)
    np.testing.assert_array_equal(np.asarray(shared.tokens), np.asarray(repeated.tokens))
    np.testing.assert_allclose(np.asarray(shared.logp), np.asarray(repeated.logp), **close(atol=1e-5))


def test_temperature_samples_of_one_prompt_differ(sampler, prompts):
    s, state = sampler
    n = 4
    out = s(state, *prompts, jax.random.key(1), SamplingParams(temperature=1.0), num_samples=n)
    tokens = np.asarray(out.tokens)
    assert tokens.shape == (len(PROMPT_LENGTHS) * n, T)
    groups = tokens.reshape(len(PROMPT_LENGTHS), n, T)
    assert all(len({tuple(row) for row in group}) > 1 for group in groups)  # independent draws per sample
    with pytest.raises(ValueError, match="num_samples=0"):
        s(state, *prompts, jax.random.key(1), GREEDY, num_samples=0)


def expected_after_eos(reference: np.ndarray, eos_ids: set[int]):
    """(tokens, mask, lengths, truncated) that EOS handling must produce from greedy `reference`."""
    tokens = np.full_like(reference, TOKENIZER.pad_id)
    mask = np.zeros(reference.shape, np.float32)
    lengths, truncated = [], []
    for r, row in enumerate(reference):
        hits = [i for i, tok in enumerate(row) if tok in eos_ids]
        end = hits[0] + 1 if hits else len(row)
        tokens[r, :end] = row[:end]
        mask[r, :end] = 1.0
        lengths.append(end)
        truncated.append(not hits)
    return tokens, mask, np.array(lengths), np.array(truncated)


def eos_sampler(model, eos_ids):
    return Sampler(nnx.graphdef(model), max_new_tokens=T, eos_ids=tuple(eos_ids), pad_id=TOKENIZER.pad_id)


def check_eos_handling(model, prompts, reference, eos_ids):
    out = eos_sampler(model, eos_ids)(nnx.state(model), *prompts, jax.random.key(0), GREEDY)
    tokens, mask, lengths, truncated = expected_after_eos(reference, set(eos_ids))
    np.testing.assert_array_equal(np.asarray(out.tokens), tokens)  # pad after EOS
    np.testing.assert_array_equal(np.asarray(out.mask), mask)  # 1 up to and including EOS
    np.testing.assert_array_equal(np.asarray(out.lengths), lengths)
    np.testing.assert_array_equal(np.asarray(out.truncated), truncated)
    assert np.all(np.asarray(out.logp)[mask == 0] == 0.0)
    assert np.all(np.asarray(out.logp)[mask == 1] < 0.0)
    return lengths, truncated


def test_eos_ends_some_rows_and_others_run_to_the_limit(model, prompts, greedy_reference):
    # a token that row 0 emits early but some other row never emits
    candidates = [
        int(tok)
        for tok in greedy_reference[0, 1 : T - 2]
        if not all(tok in row for row in greedy_reference)
    ]
    assert candidates, "the random model emits the same tokens in every row; pick another seed"
    lengths, truncated = check_eos_handling(model, prompts, greedy_reference, [candidates[0]])
    assert truncated.any() and not truncated.all()
    assert lengths.min() < T


def test_decoding_stops_when_every_row_has_ended(model, prompts, greedy_reference):
    # each row's token at T // 2 is an EOS: every row ends by then and the loop exits early
    eos_ids = sorted({int(tok) for tok in greedy_reference[:, T // 2]})
    lengths, truncated = check_eos_handling(model, prompts, greedy_reference, eos_ids)
    assert not truncated.any()
    assert lengths.max() <= T // 2 + 1


def test_empty_eos_ids_is_an_error(model):
    with pytest.raises(ValueError, match="eos_ids is empty"):
        Sampler(nnx.graphdef(model), max_new_tokens=T, eos_ids=(), pad_id=0)


# -- sampling --------------------------------------------------------------------------------


def sample(sampler, prompts, key, params):
    s, state = sampler
    return s(state, *prompts, key, params)


def test_same_key_same_tokens_different_key_different_tokens(sampler, prompts):
    params = SamplingParams(temperature=1.0)
    a = sample(sampler, prompts, jax.random.key(1), params)
    b = sample(sampler, prompts, jax.random.key(1), params)
    c = sample(sampler, prompts, jax.random.key(2), params)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_array_equal(np.asarray(a.logp), np.asarray(b.logp))
    assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))


def test_top_k_1_and_tiny_top_p_equal_greedy(model, sampler, prompts, greedy_reference):
    for params in (SamplingParams(temperature=1.0, top_k=1), SamplingParams(temperature=0.7, top_p=1e-6)):
        out = sample(sampler, prompts, jax.random.key(3), params)
        np.testing.assert_array_equal(np.asarray(out.tokens), greedy_reference, err_msg=str(params))
        # one token left to sample from, but its log-prob is the full tempered softmax's (the
        # learner's), not 0 (the renormalised one-token distribution's)
        recomputed = learner_logprobs(nnx.state(model), *prompts, out.tokens, graphdef=nnx.graphdef(model),
                                      temperature=params.temperature)
        mask = np.asarray(out.mask) > 0
        np.testing.assert_allclose(np.asarray(out.logp)[mask], np.asarray(recomputed)[mask],
            **close(rtol=1e-5, atol=1e-5))
        assert np.asarray(out.logp)[mask].max() < -1e-3


def test_top_k_samples_only_among_the_k_most_likely(sampler, prompts, full_logits):
    out = sample(sampler, prompts, jax.random.key(4), SamplingParams(temperature=1.0, top_k=5))
    logits = np.asarray(full_logits(*prompts, out.tokens))[:, prompts[0].shape[1] - 1 : -1]  # [B, T, V]
    tokens, mask = np.asarray(out.tokens), np.asarray(out.mask)
    token_logit = np.take_along_axis(logits, tokens[..., None], axis=-1)
    rank = np.sum(logits > token_logit, axis=-1)  # 0 = most likely
    assert rank[mask > 0].max() < 5
    assert rank[mask > 0].max() > 0  # not just greedy
    # log-probs are those of the full softmax the learner computes, not of the renormalised top 5
    top = logits.max(axis=-1, keepdims=True)
    logz = top[..., 0] + np.log(np.sum(np.exp(logits - top), axis=-1))
    expected = token_logit[..., 0] - logz
    np.testing.assert_allclose(np.asarray(out.logp)[mask > 0], expected[mask > 0], **close(atol=1e-5))


def test_filter_logits_top_p_keeps_the_crossing_token():
    # probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps the first two (0.5 < 0.7 <= 0.8)
    logits = jnp.log(jnp.array([[0.15, 0.5, 0.05, 0.3]]))
    kept = np.isfinite(np.asarray(filter_logits(logits, SamplingParams(top_p=0.7))))
    np.testing.assert_array_equal(kept, [[False, True, False, True]])
    kept = np.isfinite(np.asarray(filter_logits(logits, SamplingParams(top_p=0.45))))
    np.testing.assert_array_equal(kept, [[False, True, False, False]])
    kept = np.isfinite(np.asarray(filter_logits(logits, SamplingParams(top_k=3))))
    np.testing.assert_array_equal(kept, [[True, True, False, True]])


# -- sampler log-probs equal the learner's ----------------------------------------------------


@functools.partial(jax.jit, static_argnames=("graphdef", "temperature"))
def learner_logprobs(state, prompt_tokens, prompt_mask, completion, *, graphdef, temperature):
    return completion_logprobs(
        nnx.merge(graphdef, state), prompt_tokens, prompt_mask, completion, temperature=temperature, chunk_tokens=4
    )[0]


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0), (0.7, 0, 0.9), (1.0, 3, 0.8)]
)
def test_sampler_logprobs_equal_recomputed_logprobs(model, sampler, prompts, temperature, top_k, top_p):
    """Also under top-k / top-p: the truncated importance weight exp(learner - sampler) is 1 when
    nothing but the truncation differs (it was the kept mass: 0.90 mean at top_p=0.9, 0.35 at top_k=5)."""
    out = sample(sampler, prompts, jax.random.key(5), SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    recomputed = learner_logprobs(
        nnx.state(model), *prompts, out.tokens, graphdef=nnx.graphdef(model), temperature=temperature
    )
    mask = np.asarray(out.mask) > 0
    np.testing.assert_allclose(np.asarray(out.logp)[mask], np.asarray(recomputed)[mask], **close(rtol=1e-5, atol=1e-5))
    assert np.asarray(out.logp)[mask].std() > 0.1  # real, varied log-probs, not a constant


def test_greedy_logprobs_are_those_of_the_untempered_policy(model, sampler, prompts):
    out = sample(sampler, prompts, jax.random.key(0), GREEDY)
    recomputed = learner_logprobs(nnx.state(model), *prompts, out.tokens, graphdef=nnx.graphdef(model), temperature=1.0)
    np.testing.assert_allclose(np.asarray(out.logp), np.asarray(recomputed), **close(rtol=1e-5, atol=1e-5))


def test_first_argmax_is_argmax_with_ties_infinities_and_nans():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, (200, 7)).astype(np.float32)  # many ties: the first index wins
    x[rng.random(x.shape) < 0.2] = -np.inf
    x[5] = -np.inf  # every entry -inf: index 0
    x[6, [2, 4]] = np.nan  # a NaN counts as the maximum: the first NaN
    x[7, 3] = np.nan
    x[8, 1], x[8, 5] = np.inf, np.nan
    expected = np.argmax(x, axis=-1)  # NumPy's, on the host: the rule, whatever a backend's reductions do
    got = jax.jit(first_argmax)(x)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), expected)
    assert expected[5] == 0 and expected[6] == 2 and expected[7] == 3 and expected[8] == 5


class NanDroppingMax:
    """jax.numpy whose max reduction skips NaN, as a backend's may (XLA:CPU's returns NaN)."""

    def __getattr__(self, name):
        return getattr(jnp, name)

    @staticmethod
    def max(x, axis=None, keepdims=False):
        return jnp.max(jnp.where(jnp.isnan(x), -jnp.inf, x), axis=axis, keepdims=keepdims)


def test_first_argmax_does_not_rely_on_the_max_returning_nan(monkeypatch):
    """Row 0: 3.0 at index 1 and a NaN at 4: the NaN wins (jnp.argmax's rule); a first_argmax
    that took the max's NaN for granted gives 1 under a NaN-dropping max."""
    x = jnp.array([[0.0, 3.0, 1.0, 3.0, jnp.nan], [0.0, 3.0, 1.0, 3.0, 2.0], [jnp.nan, 1.0, jnp.inf, 0.0, 0.0]])
    monkeypatch.setattr(sampler_module, "jnp", NanDroppingMax())
    assert not np.isnan(sampler_module.jnp.max(x))  # the stand-in drops NaN
    np.testing.assert_array_equal(np.asarray(first_argmax(x)), [4, 1, 0])


def test_categorical_draws_exactly_what_jax_random_categorical_draws():
    logits = jax.random.normal(jax.random.PRNGKey(7), (64, V)) * 3.0
    logits = jnp.where(jax.random.uniform(jax.random.PRNGKey(8), logits.shape) < 0.3, -jnp.inf, logits)  # top-k/p cuts
    for seed in range(20):
        key = jax.random.PRNGKey(seed)
        np.testing.assert_array_equal(
            np.asarray(jax.jit(categorical)(key, logits)),
            np.asarray(jax.random.categorical(key, logits, axis=-1)),
        )


TWO_OPERAND_REDUCE = re.compile(r"stablehlo\.reduce\(%[^)]*init: [^)]*\), \(%")  # reduce(%a init: %x), (%b init: %y)


def test_sampling_has_no_two_operand_reduction():
    """argmax's (value, index) reduction is what `first_argmax` replaces (a scalar loop on CPU)."""
    logits = jnp.zeros((4, V))
    assert TWO_OPERAND_REDUCE.search(jax.jit(lambda x: jnp.argmax(x, axis=-1)).lower(logits).as_text())
    for fn in (first_argmax, functools.partial(categorical, jax.random.PRNGKey(0))):
        text = jax.jit(fn).lower(logits).as_text()
        assert "stablehlo.reduce" in text and not TWO_OPERAND_REDUCE.search(text)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)])
def test_an_accelerators_decode_over_the_live_blocks_samples_what_the_masked_attention_does(prompts, sampling):
    """The sampler traced as for a TPU (scanned layers, `attention: xla` so that it runs here) decodes with
    `rl_models.block.attend_live` (the live blocks of the cache, online softmax, values read in place):
    the same tokens and log-probs as with the masked attention over every slot (`DECODE_ATTENTION =
    "masked"`, the program before), in blocks of 8 slots so that 8 + 10 slots make three of them."""
    config = TransformerConfig.tiny(V, attention="xla")
    model = Transformer(config, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    outs = {}
    old = block_lib.BLOCK_SLOTS, block_lib.LIVE_BLOCKS, attention_lib.DECODE_ATTENTION
    try:
        block_lib.BLOCK_SLOTS, block_lib.LIVE_BLOCKS = 8, 3
        for way in ("masked", "live"):
            attention_lib.DECODE_ATTENTION = way
            with attention_lib.traced_for("tpu"):
                sampler = Sampler(graphdef, max_new_tokens=T, eos_ids=(TOKENIZER.eos_id,), pad_id=TOKENIZER.pad_id)
                outs[way] = sampler(state, *prompts, jax.random.key(3), sampling, 2)
    finally:
        block_lib.BLOCK_SLOTS, block_lib.LIVE_BLOCKS, attention_lib.DECODE_ATTENTION = old
    np.testing.assert_array_equal(outs["live"].tokens, outs["masked"].tokens)
    np.testing.assert_array_equal(outs["live"].mask, outs["masked"].mask)
    np.testing.assert_allclose(outs["live"].logp, outs["masked"].logp, **close(rtol=1e-5, atol=1e-5))


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)])
def test_an_accelerators_lane_packed_cache_samples_what_the_heads_layout_does(prompts, sampling):
    """The sampler traced as for a TPU on a model of 2 KV heads of 64 (Qwen2.5-0.5B's), which keeps a
    `rl_models.block.LaneKV` (its heads side by side in 128 lanes): the same tokens and log-probs as the
    heads' layout [.., K, S, Dh] with the masked attention (`DECODE_ATTENTION = "masked"`)."""
    config = TransformerConfig.tiny(V, hidden_size=256, num_heads=4, num_kv_heads=2, attention="xla")
    model = Transformer(config, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    outs = {}
    old = attention_lib.DECODE_ATTENTION
    try:
        for way in ("masked", "lanes"):
            attention_lib.DECODE_ATTENTION = way
            with attention_lib.traced_for("tpu"):
                assert block_lib.lane_packed(config) == (way == "lanes")
                sampler = Sampler(graphdef, max_new_tokens=T, eos_ids=(TOKENIZER.eos_id,), pad_id=TOKENIZER.pad_id)
                outs[way] = sampler(state, *prompts, jax.random.key(3), sampling, 2)
    finally:
        attention_lib.DECODE_ATTENTION = old
    np.testing.assert_array_equal(outs["lanes"].tokens, outs["masked"].tokens)
    np.testing.assert_array_equal(outs["lanes"].mask, outs["masked"].mask)
    np.testing.assert_allclose(outs["lanes"].logp, outs["masked"].logp, **close(rtol=1e-5, atol=1e-5))
