"""rl_core.train.packing: packed passes give the padded passes' log-probs and gradients, on less padding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rl_core.policy.logprobs import completion_logprobs, packed_logprobs
from rl_core.packed import unpack
from rl_core.train.packing import pack, pack_micro_batches, packed_rows, padded_positions, reused_rows
from rl_models import CharTokenizer, Transformer, TransformerConfig
from tolerances import close

V = CharTokenizer().vocab_size
P, T = 8, 12
PROMPTS = (5, 2, 8, 3, 1, 6)  # real prompt tokens per row (left-padded to P)
COMPLETIONS = (12, 3, 0, 7, 1, 5)  # real completion tokens (the mask); 0: nothing in the loss


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(3)
    b = len(PROMPTS)
    prompt_mask = np.zeros((b, P), np.float32)
    mask = np.zeros((b, T), np.float32)
    for row, (n, m) in enumerate(zip(PROMPTS, COMPLETIONS, strict=True)):
        prompt_mask[row, P - n :] = 1
        mask[row, :m] = 1
    prompt = np.where(prompt_mask > 0, rng.integers(3, V, (b, P)), 0).astype(np.int32)
    completion = rng.integers(3, V, (b, T)).astype(np.int32)
    adv = rng.normal(size=b).astype(np.float32)
    return prompt, prompt_mask, completion, mask, adv


@pytest.fixture(scope="module")
def split():
    return nnx.split(Transformer(TransformerConfig.tiny(V), rngs=nnx.Rngs(2)))


def test_pack_places_every_real_token_once_and_cuts_the_padding(batch):
    prompt, prompt_mask, completion, mask, _ = batch
    packed = pack(prompt, prompt_mask, completion, mask)
    real = sum(n + m for n, m in zip(PROMPTS, COMPLETIONS, strict=True) if m)  # 17+5+10+2+11 = 45
    assert real == 45
    # first-fit decreasing (17, 11, 10, 5, 2) into rows of P + T = 20: [17, 2], [11, 5], [10]: 3 rows,
    # a row count of its own (packed_rows(3) == 3)
    assert packed.tokens.shape == (3, 20) and packed_rows(3) == 3
    assert (np.asarray(packed.segments) > 0).sum() == real
    assert padded_positions(packed) == 3 * 20 - 45 == 15
    unpacked_padding = len(PROMPTS) * (P + T) - real  # 120 - 45 = 75 computed on nothing
    assert padded_positions(packed) < unpacked_padding
    # positions restart in each segment; completion token j is predicted by the token before it
    seg, pos, tok = (np.asarray(x) for x in (packed.segments, packed.positions, packed.tokens))
    for r in range(3):
        for k in range(1, seg[r].max(initial=0) + 1):
            np.testing.assert_array_equal(pos[r][seg[r] == k], np.arange((seg[r] == k).sum()))
    flat = tok.reshape(-1)
    for row, m in enumerate(COMPLETIONS):
        if m:
            np.testing.assert_array_equal(flat[np.asarray(packed.index)[row, :m] + 1], completion[row, :m])


def test_packed_logprobs_and_gradients_equal_the_padded_pass(batch, split):
    prompt, prompt_mask, completion, mask, adv = batch
    graphdef, state = split
    packed = pack(prompt, prompt_mask, completion, mask)

    def loss(state, packed_or_none):
        model = nnx.merge(graphdef, state)
        if packed_or_none is None:
            logp, entropy = completion_logprobs(model, prompt, prompt_mask, completion, temperature=0.8,
                                                chunk_tokens=5)
        else:
            logp, entropy = packed_logprobs(model, packed_or_none, completion, temperature=0.8, chunk_tokens=5)
        return jnp.sum(-adv[:, None] * logp * mask), (logp, entropy)

    (l_pad, (logp_pad, ent_pad)), g_pad = jax.jit(jax.value_and_grad(loss, has_aux=True))(state, None)
    (l_pack, (logp_pack, ent_pack)), g_pack = jax.jit(jax.value_and_grad(loss, has_aux=True))(state, packed)
    np.testing.assert_allclose(np.asarray(logp_pack) * mask, np.asarray(logp_pad) * mask, **close(atol=1e-5))
    np.testing.assert_allclose(np.asarray(ent_pack) * mask, np.asarray(ent_pad) * mask, **close(atol=1e-5))
    np.testing.assert_allclose(l_pack, l_pad, **close(rtol=1e-5, atol=1e-5))
    assert abs(float(l_pad)) > 1.0  # a real loss was compared
    for a, b in zip(jax.tree.leaves(g_pack), jax.tree.leaves(g_pad), strict=True):
        np.testing.assert_allclose(a, b, **close(rtol=1e-5, atol=1e-5))


def test_pack_refuses_what_cannot_fit(batch):
    prompt, prompt_mask, completion, mask, _ = batch
    with pytest.raises(ValueError, match="does not fit packed rows of 10"):
        pack(prompt, prompt_mask, completion, mask, width=10)
    with pytest.raises(ValueError, match="need 3 packed rows of 20 tokens; 2 were given"):
        pack(prompt, prompt_mask, completion, mask, rows=2)
    empty = prompt_mask.copy()
    empty[1] = 0
    with pytest.raises(ValueError, match=r"prompt rows \[1\] have no token"):
        pack(prompt, empty, completion, mask)


def test_each_block_of_rows_packs_into_its_own_rows_with_local_indices(batch):
    """Two blocks of three sequences (one per device on a mesh of two): block 0 holds the 17-,
    5- and 0-token sequences, block 1 the 10-, 2- and 11-token ones; each is packed into the
    same number of rows (the most either needs, 2, a power of two) and indexes its own rows."""
    prompt, prompt_mask, completion, mask, _ = batch
    packed = pack(prompt, prompt_mask, completion, mask, shards=2)
    assert packed.tokens.shape == (2 * 2, 20)
    seg = np.asarray(packed.segments)
    # block 0: [17], [5] (the empty completion packs nothing); block 1: [11, 2], [10]
    assert [(seg[r] > 0).sum() for r in range(4)] == [17, 5, 13, 10]
    index = np.asarray(packed.index)
    for row, m in enumerate(COMPLETIONS):
        if m:
            assert index[row, :m].max() < 2 * 20  # within its block's two rows
            block_tokens = np.asarray(packed.tokens)[row // 3 * 2 : row // 3 * 2 + 2].reshape(-1)
            np.testing.assert_array_equal(block_tokens[index[row, :m] + 1], completion[row, :m])
    hidden = jnp.arange(4 * 20 * 3, dtype=jnp.float32).reshape(4, 20, 3)
    got = np.asarray(unpack(hidden, packed.index, shards=2))
    flat = np.asarray(hidden).reshape(2, 40, 3)
    for row in range(6):
        np.testing.assert_array_equal(got[row], flat[row // 3][index[row]])


def test_micro_batches_pack_into_one_row_count(batch):
    prompt, prompt_mask, completion, mask, _ = batch
    stack = lambda x: np.stack([x, x[::-1]])  # noqa: E731  two micro-batches of the same six rows
    packed = pack_micro_batches(stack(prompt), stack(prompt_mask), stack(completion), stack(mask), shards=2)
    assert packed.tokens.shape == (2, 2 * 2, 20) and packed.index.shape == (2, 6, T)
    # micro-batch 1 reversed: block 0 holds the 5-, 11- and 2-token ones (2 rows), block 1 17, 10 (2)
    single = pack(prompt[::-1], prompt_mask[::-1], completion[::-1], mask[::-1], shards=2)
    for got, want in zip(packed, single, strict=True):
        np.testing.assert_array_equal(np.asarray(got)[1], np.asarray(want))


def test_a_mask_with_holes_packs_through_them(batch, split):
    """Multi-turn episodes mask the environment's tokens out of the loss mid-completion: the
    packed row keeps them (later tokens attend to them), and the loss tokens' log-probs equal
    the padded pass's."""
    prompt, prompt_mask, completion, mask, _ = batch
    holes = mask.copy()
    holes[0, 3:6] = 0  # row 0: tokens 3-5 are an observation, 6-11 the next turn
    packed = pack(prompt, prompt_mask, completion, holes)
    assert (np.asarray(packed.segments) > 0).sum() == 45  # the same tokens as without the hole
    graphdef, state = split
    model = nnx.merge(graphdef, state)
    padded, _ = completion_logprobs(model, prompt, prompt_mask, completion, temperature=1.0, chunk_tokens=4)
    packed_logp, _ = packed_logprobs(model, packed, completion, temperature=1.0, chunk_tokens=4)
    np.testing.assert_allclose(np.asarray(packed_logp) * holes, np.asarray(padded) * holes, **close(atol=1e-5))


def test_packed_row_counts_take_four_steps_an_octave():
    """128 completions that pack into 90 rows compile 96, not the unpacked 128 (the next power of two)."""
    assert [packed_rows(u) for u in (0, 1, 3, 5, 8, 9, 13, 17, 65, 90, 100, 128, 129)] == \
        [1, 1, 3, 5, 8, 10, 14, 20, 80, 96, 112, 128, 160]
    assert packed_rows(90, cap=64) == 64  # never more rows than sequences
    assert len({packed_rows(u) for u in range(65, 129)}) == 4  # 80, 96, 112, 128: four programs at most


def test_a_run_reuses_a_larger_row_count_it_compiled_before_compiling_a_smaller_one():
    compiled: set[tuple[int, ...]] = set()
    assert [reused_rows(n, compiled, (1, 128, 263)) for n in (96, 80, 112, 80, 128)] == [96, 96, 112, 96, 128]
    assert reused_rows(80, compiled, (2, 128, 263)) == 80  # another micro-batch count is another program
    assert reused_rows(80, compiled, (1, 96, 263)) == 80  # another micro-batch size (the log-prob pass's all rows)
    assert reused_rows(80, compiled, (1, 128, 100)) == 80  # and another width
    assert compiled == {(1, 128, 263, 96), (1, 128, 263, 112), (1, 128, 263, 128), (2, 128, 263, 80),
                        (1, 96, 263, 80), (1, 128, 100, 80)}
    assert reused_rows(80, None) == 80  # nothing kept: each pack its own count


def test_a_pack_into_more_rows_than_it_needs_holds_the_same_sequences(batch):
    """After a step whose blocks took 3 rows, one that needs 2 runs the 3-row shape: the same
    tokens, positions and gather indices (local to each block), and a third row of padding."""
    prompt, prompt_mask, completion, mask, _ = batch
    stack = lambda x: x[None]  # noqa: E731  one micro-batch
    compiled: set[tuple[int, ...]] = set()
    long = np.ones_like(mask)
    first = pack_micro_batches(stack(prompt), stack(np.ones_like(prompt_mask)), stack(completion), stack(long),
                               shards=2, compiled=compiled)
    assert first.tokens.shape == (1, 2 * 3, 20) and compiled == {(1, 6, 20, 3)}  # 20 tokens a sequence: one a row
    alone = pack_micro_batches(stack(prompt), stack(prompt_mask), stack(completion), stack(mask), shards=2)
    reused = pack_micro_batches(stack(prompt), stack(prompt_mask), stack(completion), stack(mask), shards=2,
                                compiled=compiled)
    assert alone.tokens.shape == (1, 2 * 2, 20) and reused.tokens.shape == (1, 2 * 3, 20)
    for got, want in zip(reused[:3], alone[:3], strict=True):  # tokens, positions, segments
        got, want = np.asarray(got).reshape(2, 3, 20), np.asarray(want).reshape(2, 2, 20)
        np.testing.assert_array_equal(got[:, :2], want)
        assert not got[:, 2].any()
    np.testing.assert_array_equal(np.asarray(reused.index), np.asarray(alone.index))
