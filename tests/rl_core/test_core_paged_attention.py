"""Paged attention (rl_core.rollout.attention) against dense attention, and the page pool."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core.rollout import attention as attention_lib
from rl_core.rollout.pages import PagePool, PoolExhausted
from rl_core.rollout.ragged import RaggedKV, combined_slots, ragged_layout, ragged_tpu, tiled_groups
from host import about_the_cpu
from tolerances import close

N, H, K, DH, PAGES, PS, M = 5, 4, 2, 8, 24, 4, 6
LENGTHS = np.array([1, 4, 5, 13, 24], np.int32)  # one slot, a full page, a page + 1, mid-page, all M pages


def problem(seed=0):
    """Random queries and pool; each query's sequence on distinct pages (row n never uses page 0)."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(N, H, DH)).astype(np.float32)
    k_pages = rng.normal(size=(K, PAGES, PS, DH)).astype(np.float32)
    v_pages = rng.normal(size=(K, PAGES, PS, DH)).astype(np.float32)
    page_rows = np.stack([rng.permutation(np.arange(1, PAGES))[:M] for _ in range(N)]).astype(np.int32)
    return q, k_pages, v_pages, page_rows, LENGTHS


def dense(q, k_pages, v_pages, page_rows, lengths):
    """Each query's sequence gathered into contiguous slots, then a plain masked softmax."""
    k = k_pages[:, page_rows].reshape(K, N, M * PS, DH)  # [K, N, S, Dh]
    v = v_pages[:, page_rows].reshape(K, N, M * PS, DH)
    qg = q.reshape(N, K, H // K, DH)
    scores = jnp.einsum("nkgd,knsd->nkgs", qg, k) / math.sqrt(DH)
    valid = np.arange(M * PS)[None, :] < lengths[:, None]
    probs = jax.nn.softmax(jnp.where(valid[:, None, None], scores, -jnp.inf), axis=-1)
    return jnp.einsum("nkgs,knsd->nkgd", probs, v).reshape(N, H, DH)


def page_major(q, k_pages, v_pages, page_rows, lengths):
    """The reference's layout [P, ps, K, Dh] of the kv-major pages [K, P, ps, Dh]."""
    return q, k_pages.transpose(1, 2, 0, 3), v_pages.transpose(1, 2, 0, 3), page_rows, lengths


@pytest.mark.parametrize("pages_per_block", [1, 4, 8])
@pytest.mark.parametrize("jit", [False, True])
def test_reference_equals_dense_attention(pages_per_block, jit):
    fn = functools.partial(attention_lib.reference_paged_attention, pages_per_block=pages_per_block)
    fn = jax.jit(fn) if jit else fn
    args = problem()
    np.testing.assert_allclose(fn(*page_major(*args)), dense(*args), **close(atol=1e-5))


def test_reference_under_vmap_and_blind_to_pages_past_the_length():
    args = [np.stack([a, b]) for a, b in zip(problem(0), problem(1), strict=True)]
    out = jax.vmap(lambda *a: attention_lib.reference_paged_attention(*page_major(*a)))(*args)
    for i in range(2):
        np.testing.assert_allclose(out[i], dense(*[a[i] for a in args]), **close(atol=1e-5))
    q, k_pages, v_pages, page_rows, lengths = problem()
    # garbage on every page slot past each query's length changes nothing (pages hold stale but
    # finite keys/values of earlier sequences)
    poisoned = [np.array(x) for x in (k_pages, v_pages)]
    for n in range(N):
        for j in range(lengths[n], M * PS):
            for x in poisoned:
                x[:, page_rows[n, j // PS], j % PS] = 1e4
    keep = np.ones(N, bool)  # rows sharing a poisoned page with a longer row would see it: compare the rest
    for n in range(N):
        pages_n = set(page_rows[n, : -(-lengths[n] // PS)])
        keep[n] = all(not (set(page_rows[m, lengths[m] // PS :]) & pages_n) for m in range(N) if m != n)
    got = attention_lib.reference_paged_attention(*page_major(q, *poisoned, page_rows, lengths))
    assert keep.sum() >= 2
    np.testing.assert_allclose(np.asarray(got)[keep], np.asarray(dense(q, k_pages, v_pages, page_rows, lengths))[keep],
                               **close(atol=1e-5))


def test_choice_by_platform():
    choose = attention_lib.choose
    assert choose("auto", 16, "cpu") == attention_lib.ReferenceKV(16)
    # TPU: the ragged kernel, blocks of 512 tokens
    assert choose("auto", 16, "tpu") == RaggedKV(16, 32)
    assert choose("pallas", 64, "tpu") == RaggedKV(64, 8)
    assert choose("auto", 16, "gpu") == attention_lib.PallasKV(16, platform="gpu")
    assert choose("reference", 16, "tpu") == attention_lib.ReferenceKV(16)
    with pytest.raises(ValueError, match="TPU and GPU only"):
        choose("pallas", 16, "cpu")
    with pytest.raises(ValueError, match="must be one of"):
        choose("flash", 16, "cpu")


@pytest.mark.parametrize("kv", [attention_lib.ReferenceKV(PS, 2), attention_lib.PallasKV(PS, 2, interpret=True)],
                         ids=["reference", "pallas-gpu-interpreted"])
def test_write_then_attend_in_either_layout(kv):
    """Each layout writes a token's key/value where its attention reads them, per layer."""
    q, k_pages, v_pages, page_rows, lengths = problem()
    rng = np.random.default_rng(2)
    k_new, v_new = (rng.normal(size=(N, K, DH)).astype(np.float32) for _ in range(2))
    positions = lengths - 1  # each query is its sequence's newest token
    pages = kv.init(2, K, DH, jnp.float32, PAGES)
    old = page_major(q, k_pages, v_pages, page_rows, lengths)[1:3] if isinstance(kv, attention_lib.ReferenceKV) \
        else (k_pages, v_pages)
    pages = tuple(p.at[1].set(o) for p, o in zip(pages, old, strict=True))  # layer 1 holds the sequences
    out, pages = kv(q, k_new, v_new, pages, 1, page_rows, positions)
    k_want, v_want = (np.array(x) for x in (k_pages, v_pages))
    for n in range(N):
        page, offset = page_rows[n, positions[n] // PS], positions[n] % PS
        k_want[:, page, offset], v_want[:, page, offset] = k_new[n], v_new[n]
    np.testing.assert_allclose(out, dense(q, k_want, v_want, page_rows, lengths), **close(atol=1e-5))
    assert not np.asarray(pages[0][0]).any()  # layer 0 untouched


def test_page_pool_counts_holders():
    pool = PagePool(6)
    assert pool.free == 5  # page 0 is scratch
    a = pool.allocate(3)
    assert 0 not in a and pool.in_use == 3
    pool.retain(a[:2])  # a second holder of two of them
    pool.release(a)
    assert pool.in_use == 2 and [pool.refcount(p) for p in a] == [1, 1, 0]
    with pytest.raises(PoolExhausted, match="4 pages asked, 3 of 5 free"):
        pool.allocate(4)
    assert pool.free == 3  # a refused request takes nothing
    pool.release(a[:2])
    assert pool.in_use == 0
    with pytest.raises(ValueError, match="released more often than held"):
        pool.release(a[:1])
    with pytest.raises(ValueError, match="is free"):
        pool.retain(a[:1])


def test_gpu_pallas_kernel_in_interpret_mode_equals_dense():
    """JAX's Triton paged-attention kernel, run by the Pallas interpreter on CPU: checks how the
    engine calls it (query scaling, padded page rows, split partitions), not the GPU itself."""
    args = problem()
    out = attention_lib._pallas_gpu(*map(jnp.asarray, args), pages_per_block=2, interpret=True)
    np.testing.assert_allclose(out, dense(*args), **close(atol=1e-5))


def windowed_dense(q, k_pages, v_pages, page_rows, lengths, window):
    """`dense` with each query seeing only its last `window` slots."""
    k = k_pages[:, page_rows].reshape(K, N, M * PS, DH)
    v = v_pages[:, page_rows].reshape(K, N, M * PS, DH)
    scores = jnp.einsum("nkgd,knsd->nkgs", q.reshape(N, K, H // K, DH), k) / math.sqrt(DH)
    slots = np.arange(M * PS)[None, :]
    valid = (slots < lengths[:, None]) & (slots >= lengths[:, None] - window)
    probs = jax.nn.softmax(jnp.where(valid[:, None, None], scores, -jnp.inf), axis=-1)
    return jnp.einsum("nkgs,knsd->nkgd", probs, v).reshape(N, H, DH)


def disjoint_problem(seed=0):
    """`problem` with every row on pages of its own (page 0 unused), so spoiling one row's
    slots touches no other row's."""
    rng = np.random.default_rng(seed)
    pages = N * M + 1
    q = rng.normal(size=(N, H, DH)).astype(np.float32)
    k_pages, v_pages = (rng.normal(size=(K, pages, PS, DH)).astype(np.float32) for _ in range(2))
    page_rows = rng.permutation(np.arange(1, pages)).reshape(N, M).astype(np.int32)
    return q, k_pages, v_pages, page_rows, LENGTHS


def _windowed(args, window, kv_head_major):
    q, k_pages, v_pages, page_rows, lengths = args
    if kv_head_major:
        pools = (k_pages[None], v_pages[None])  # [L=1, K, P, ps, Dh]
    else:
        pools = (k_pages.transpose(1, 2, 0, 3)[None], v_pages.transpose(1, 2, 0, 3)[None])
    fn = functools.partial(attention_lib.reference_paged_attention, layer=0, window=window, pages_per_block=1,
                           kv_head_major=kv_head_major)
    return jax.jit(fn)(q, *pools, page_rows, lengths)


def _spoil(k_pages, v_pages, page_rows, rows, before, value):
    """Copies of the pools with `value` in slots 0..before[i] - 1 of each row i in `rows`."""
    k_bad, v_bad = k_pages.copy(), v_pages.copy()
    for n, end in zip(rows, before, strict=True):
        for slot in range(end):
            k_bad[:, page_rows[n, slot // PS], slot % PS] = v_bad[:, page_rows[n, slot // PS], slot % PS] = value
    return k_bad, v_bad


@pytest.mark.parametrize("window", [1, 3, 6, 100])
@pytest.mark.parametrize("kv_head_major", [False, True], ids=["page-major", "kv-head-major"])
def test_windowed_reference_equals_the_dense_windowed_softmax(window, kv_head_major):
    """A sliding-window layer's attention (3 and 6 cut mid-page; 100 is longer than every
    sequence), with huge stale keys and values in every slot before each query's window: they
    get no weight. Both pool layouts (PallasKV's windowed layers run over its kv-head-major pool)."""
    q, k_pages, v_pages, page_rows, lengths = disjoint_problem()
    want = windowed_dense(q, k_pages, v_pages, page_rows, lengths, window)
    starts = [max(int(n) - window, 0) for n in lengths]
    k_bad, v_bad = _spoil(k_pages, v_pages, page_rows, range(N), starts, 1e6)
    np.testing.assert_allclose(_windowed((q, k_bad, v_bad, page_rows, lengths), window, kv_head_major), want,
                               **close(atol=1e-5))


@pytest.mark.parametrize("kv_head_major", [False, True], ids=["page-major", "kv-head-major"])
def test_windowed_reference_does_not_read_blocks_before_every_window(kv_head_major):
    """Queries at 13 and 24 slots with a window of 3 start at slots 10 and 21: pages 0 and 1
    of both (slots 0-7) are never read, so NaN there changes nothing."""
    q, k_pages, v_pages, page_rows, lengths = disjoint_problem()
    rows = [3, 4]
    args = (q[rows], k_pages, v_pages, page_rows[rows], lengths[rows])
    want = _windowed(args, 3, kv_head_major)
    k_bad, v_bad = _spoil(k_pages, v_pages, page_rows, rows, [8, 8], np.nan)
    got = _windowed((q[rows], k_bad, v_bad, page_rows[rows], lengths[rows]), 3, kv_head_major)
    np.testing.assert_array_equal(got, want)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("kv_head_major", [False, True])
def test_sink_logits_take_mass_and_add_no_value(kv_head_major):
    """With sinks s [H]: out = sum_j exp(x_j) v_j / (sum_j exp(x_j) + exp(s)), the dense softmax
    over the slots plus one value-less logit; a sink of -inf changes nothing."""
    q, k_pages, v_pages, page_rows, lengths = problem(3)
    sinks = np.array([0.5, -1.0, 2.0, 30.0], np.float32)  # 30: larger than every score (the max moves)
    k = k_pages[:, page_rows].reshape(K, N, M * PS, DH)
    v = v_pages[:, page_rows].reshape(K, N, M * PS, DH)
    scores = np.einsum("nkgd,knsd->nkgs", q.reshape(N, K, H // K, DH), k) / math.sqrt(DH)
    scores = np.where((np.arange(M * PS)[None, :] < lengths[:, None])[:, None, None], scores, -np.inf)
    e = np.exp(scores.astype(np.float64))
    denominator = e.sum(-1) + np.exp(sinks.astype(np.float64)).reshape(1, K, H // K)
    expected = (np.einsum("nkgs,knsd->nkgd", e, v) / denominator[..., None]).reshape(N, H, DH)
    pools = (k_pages, v_pages) if kv_head_major else (k_pages.transpose(1, 2, 0, 3), v_pages.transpose(1, 2, 0, 3))
    out = attention_lib.reference_paged_attention(q, pools[0][None], pools[1][None], page_rows, lengths, layer=0,
                                                  sinks=sinks, pages_per_block=2, kv_head_major=kv_head_major)
    np.testing.assert_allclose(out, expected, **close(atol=1e-5))
    none = attention_lib.reference_paged_attention(q, *page_major(q, k_pages, v_pages, page_rows, lengths)[1:3],
                                                   page_rows, lengths, sinks=np.full(H, -np.inf, np.float32))
    np.testing.assert_allclose(none, dense(q, k_pages, v_pages, page_rows, lengths), **close(atol=1e-5))


@pytest.mark.parametrize(("kv_heads", "head_dim", "want"), [
    (2, 64, (2, 128)), (3, 64, (2, 128)), (8, 64, (2, 128)), (1, 64, (1, 128)), (2, 16, (2, 128)),
    (8, 16, (8, 128)), (4, 128, (1, 128)), (4, 256, (1, 256)), (32, 80, (1, 128)), (8, 96, (1, 128))])
def test_tpu_lane_layout(kv_heads, head_dim, want):
    """Heads of 64 pair up in 128 lanes (3 kv heads: a zero fourth pads the second pair); 80 and 96
    are padded to 128 lanes; 128 and 256 are the kernel's own widths."""
    assert attention_lib.lane_layout(kv_heads, head_dim) == want


def packed_problem(heads, kv_heads, head_dim, seed=0):
    """`problem`'s pages for any head count and dim, with the TPU pool of the same keys and values."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(N, heads, head_dim)).astype(np.float32)
    k_pages, v_pages = (rng.normal(size=(kv_heads, PAGES, PS, head_dim)).astype(np.float32) for _ in range(2))
    page_rows = np.stack([rng.permutation(np.arange(1, PAGES))[:M] for _ in range(N)]).astype(np.int32)
    pack, lanes = attention_lib.lane_layout(kv_heads, head_dim)

    def to_pool(x):  # [K, P, ps, Dh] -> [1, groups, P, ps, lanes] through the writer's own packing
        slots = jnp.asarray(x).transpose(1, 2, 0, 3).reshape(PAGES * PS, kv_heads, head_dim)
        return attention_lib.pack_heads(slots, pack, lanes).reshape(PAGES, PS, -1, lanes).transpose(2, 0, 1, 3)[None]

    return q, k_pages, v_pages, page_rows, LENGTHS, to_pool(k_pages), to_pool(v_pages)


def dense_heads(q, k_pages, v_pages, page_rows, lengths):
    """`dense` for any head count and dim."""
    n, heads, dh = q.shape
    kv_heads = k_pages.shape[0]
    k = k_pages[:, page_rows].reshape(kv_heads, n, M * PS, dh)
    v = v_pages[:, page_rows].reshape(kv_heads, n, M * PS, dh)
    scores = jnp.einsum("nkgd,knsd->nkgs", q.reshape(n, kv_heads, heads // kv_heads, dh), k) / math.sqrt(dh)
    valid = np.arange(M * PS)[None, :] < lengths[:, None]
    probs = jax.nn.softmax(jnp.where(valid[:, None, None], scores, -jnp.inf), axis=-1)
    return jnp.einsum("nkgs,knsd->nkgd", probs, v).reshape(n, heads, dh)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(14, 2, 64), (9, 3, 64), (4, 2, 16), (4, 2, 80)])
def test_lane_packed_queries_give_each_heads_own_attention(heads, kv_heads, head_dim):
    """What the TPU kernel computes over the packed pool (plain attention of the packed queries, G'
    = pack x G of them a lane group, over lane groups as kv heads), read back through
    `unpacked_output`, is each head's own attention: the zero lanes of the other heads add nothing."""
    q, k_pages, v_pages, page_rows, lengths, k_pool, v_pool = packed_problem(heads, kv_heads, head_dim)
    pack, lanes = attention_lib.lane_layout(kv_heads, head_dim)
    scaled = q / math.sqrt(head_dim) * math.sqrt(lanes)  # `dense_heads` scales by 1/sqrt(its dim): lanes
    packed_q = attention_lib.packed_queries(jnp.asarray(scaled), kv_heads, pack, lanes)
    as_kernel = dense_heads(packed_q, k_pool[0], v_pool[0], page_rows, lengths)
    got = attention_lib.unpacked_output(as_kernel, kv_heads, heads, head_dim, pack)
    np.testing.assert_allclose(got, dense_heads(q, k_pages, v_pages, page_rows, lengths), **close(atol=1e-5))


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(14, 2, 64), (4, 2, 80)])
def test_tpu_pool_write_then_windowed_attend(heads, kv_heads, head_dim):
    """The TPU pool's writer packs a token's heads where the reference attention over that layout
    (windowed layers) unpacks them: a window longer than every sequence is plain attention."""
    q, k_pages, v_pages, page_rows, lengths, k_pool, v_pool = packed_problem(heads, kv_heads, head_dim)
    kv = attention_lib.PallasKV(PS, 2, platform="tpu")
    rng = np.random.default_rng(5)
    k_new, v_new = (rng.normal(size=(N, kv_heads, head_dim)).astype(np.float32) for _ in range(2))
    positions = lengths - 1
    out, _ = kv(jnp.asarray(q), k_new, v_new, (k_pool, v_pool), 0, page_rows, positions, window=1000)
    k_want, v_want = (np.array(x) for x in (k_pages, v_pages))
    for n in range(N):
        page, offset = page_rows[n, positions[n] // PS], positions[n] % PS
        k_want[:, page, offset], v_want[:, page, offset] = k_new[n], v_new[n]
    np.testing.assert_allclose(out, dense_heads(q, k_want, v_want, page_rows, lengths), **close(atol=1e-5))


@about_the_cpu("the TPU kernel in the Pallas interpreter; on a chip benchmarks/paged_kernel_check.py runs it")
def test_tpu_kernel_in_the_interpreter_over_the_packed_pool():
    """JAX's TPU paged-attention kernel, run by the TPU interpreter on this CPU over the lane-packed
    pool (Qwen2.5-0.5B's grouping: 7 query heads on each of 2 kv heads of 64), in bfloat16 as real
    runs keep it, hence 3e-2 (values of about 1 in 8 mantissa bits); the packing itself is exact
    (the test above). A float32 pool takes XLA's attention over the same layout, exactly."""
    from jax.experimental.pallas import tpu as pltpu

    q, k_pages, v_pages, page_rows, lengths, k_pool, v_pool = packed_problem(14, 2, 64)
    want = dense_heads(q, k_pages, v_pages, page_rows, lengths)
    kv = attention_lib.PallasKV(PS, 2, platform="tpu")
    low = [jnp.asarray(x, jnp.bfloat16) for x in (q, k_pool, v_pool)]
    with pltpu.force_tpu_interpret_mode():
        got = kv.attend(*low, 0, page_rows, lengths, None, None, kv_heads=2)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=3e-2)
    exact = kv.attend(jnp.asarray(q), k_pool, v_pool, 0, page_rows, lengths, None, None, kv_heads=2)
    np.testing.assert_allclose(exact, want, atol=1e-5)


@pytest.mark.parametrize("window", [None, 6])
def test_reference_soft_caps_the_scores_before_the_mask(window):
    """attn_logit_softcapping (Gemma 2's): scores cap * tanh(s / cap), then the mask and the softmax;
    on the page-major and the kv-head-major (Pallas) layouts, with and without a window."""
    q, k_pages, v_pages, page_rows, lengths = problem()
    q = q * 4  # scores well past the cap
    cap = 2.0
    k = k_pages[:, page_rows].reshape(K, N, M * PS, DH)
    v = v_pages[:, page_rows].reshape(K, N, M * PS, DH)
    scores = jnp.einsum("nkgd,knsd->nkgs", q.reshape(N, K, H // K, DH), k) / math.sqrt(DH)
    slots = np.arange(M * PS)[None, :]
    starts = np.zeros_like(lengths) if window is None else np.maximum(lengths - window, 0)
    valid = (slots < lengths[:, None]) & (slots >= starts[:, None])
    probs = jax.nn.softmax(jnp.where(valid[:, None, None], cap * jnp.tanh(scores / cap), -jnp.inf), axis=-1)
    want = jnp.einsum("nkgs,knsd->nkgd", probs, v).reshape(N, H, DH)
    got = attention_lib.reference_paged_attention(*page_major(q, k_pages, v_pages, page_rows, lengths), window=window,
                                                  softcap=cap)
    np.testing.assert_allclose(got, want, **close(atol=1e-5))
    head_major = attention_lib.reference_paged_attention(q, k_pages[None], v_pages[None], page_rows, lengths, layer=0,
                                                         window=window, softcap=cap, kv_head_major=True)
    np.testing.assert_allclose(head_major, want, **close(atol=1e-5))
    plain = attention_lib.reference_paged_attention(*page_major(q, k_pages, v_pages, page_rows, lengths), window=window)
    assert float(jnp.abs(plain - got).max()) > 0.1


@about_the_cpu("the TPU kernel in the Pallas interpreter; on a chip benchmarks/paged_kernel_check.py runs it")
def test_tpu_kernel_soft_caps_the_scores_as_the_reference_does():
    """The TPU kernel's `attn_logits_soft_cap` over the lane-packed pool, in bfloat16 (hence 3e-2, as
    above), against the float32 reference over the same pool; the cap moves the output by more."""
    from jax.experimental.pallas import tpu as pltpu

    q, k_pages, v_pages, page_rows, lengths, k_pool, v_pool = packed_problem(14, 2, 64)
    q = q * 4
    kv = attention_lib.PallasKV(PS, 2, platform="tpu")
    want = kv.attend(jnp.asarray(q), k_pool, v_pool, 0, page_rows, lengths, None, None, kv_heads=2, softcap=2.0)
    uncapped = kv.attend(jnp.asarray(q), k_pool, v_pool, 0, page_rows, lengths, None, None, kv_heads=2)
    assert float(jnp.abs(want - uncapped).max()) > 0.3
    low = [jnp.asarray(x, jnp.bfloat16) for x in (q, k_pool, v_pool)]
    with pltpu.force_tpu_interpret_mode():
        got = kv.attend(*low, 0, page_rows, lengths, None, None, kv_heads=2, softcap=2.0)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=3e-2)


def combined_problem(heads, kv_heads, head_dim, seed=0):
    """`packed_problem`'s keys and values in the ragged kernel's combined pool, as layer 1 of two."""
    q, k_pages, v_pages, page_rows, lengths, _, _ = packed_problem(heads, kv_heads, head_dim, seed)
    pack, lanes, groups = ragged_layout(kv_heads, head_dim)
    slots = lambda x: jnp.asarray(x).transpose(1, 2, 0, 3).reshape(PAGES * PS, kv_heads, head_dim)  # noqa: E731
    pool = combined_slots(slots(k_pages), slots(v_pages), pack, lanes, groups).reshape(1, PAGES, PS * 2 * groups, lanes)
    return q, k_pages, v_pages, page_rows, lengths, jnp.concatenate([jnp.zeros_like(pool), pool])


def test_ragged_layout_pads_lane_groups_to_a_count_the_kernel_tiles():
    """Qwen2.5-0.5B's 2 heads of 64 share one group; SmolLM2's 3 take 2; 3 heads of 128 take 4
    (one zero group), 12 heads of 128 take 16; 80 and 96 pad to 128 lanes, 256 keeps its own."""
    assert [tiled_groups(g) for g in (1, 2, 3, 4, 5, 8, 9, 12, 16)] == [1, 2, 4, 4, 8, 8, 16, 16, 16]
    assert ragged_layout(2, 64) == (2, 128, 1)
    assert ragged_layout(3, 64) == (2, 128, 2)
    assert ragged_layout(3, 128) == (1, 128, 4)
    assert ragged_layout(8, 80) == (1, 128, 8)
    assert ragged_layout(4, 256) == (1, 256, 4)


RAGGED_SHAPES = [(14, 2, 64), (9, 3, 64), (4, 2, 80), (12, 4, 96), (8, 2, 128), (6, 3, 128), (4, 2, 256)]


@pytest.mark.parametrize(("window", "softcap"), [(None, None), (6, None), (None, 2.0)], ids=["plain", "window", "cap"])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), RAGGED_SHAPES, ids=lambda x: str(x))
def test_ragged_kernel_inputs_give_each_heads_own_attention(heads, kv_heads, head_dim, window, softcap):
    """The inputs `ragged_tpu` gives the kernel (spread queries, the flattened pool of every layer with
    page ids offset by layer, one sequence a token), through the kernel's own statement of what it
    computes (`ref_ragged_paged_attention`: neither Pallas interpreter runs the kernel in JAX 0.10.2;
    benchmarks/paged_kernel_check.py runs it on a chip), equal the reference attention of each head
    over its own pages, with a window and with a soft cap; and so does the float32 path (XLA's
    attention over the combined pool)."""
    q, k_pages, v_pages, page_rows, lengths, pool = combined_problem(heads, kv_heads, head_dim)
    q = q * (4 if softcap else 1)  # scores past the cap
    want = attention_lib.reference_paged_attention(q, k_pages.transpose(1, 2, 0, 3), v_pages.transpose(1, 2, 0, 3),
                                                   page_rows, lengths, window=window, softcap=softcap)
    got = ragged_tpu(jnp.asarray(q), pool, 1, page_rows, lengths, kv_heads=kv_heads, pages_per_block=2,
                     window=window, softcap=softcap, as_its_reference=True)
    np.testing.assert_allclose(got, want, **close(atol=1e-5))
    xla = RaggedKV(PS, 2).attend(jnp.asarray(q), pool, 1, page_rows, lengths, window, kv_heads=kv_heads,
                                 softcap=softcap)
    np.testing.assert_allclose(xla, want, **close(atol=1e-5))


def test_ragged_pool_write_then_attend():
    """`RaggedKV` writes a token's key and value where its attention reads them, in its layer only."""
    q, k_pages, v_pages, page_rows, lengths, pool = combined_problem(14, 2, 64)
    rng = np.random.default_rng(5)
    k_new, v_new = (rng.normal(size=(N, 2, 64)).astype(np.float32) for _ in range(2))
    positions = lengths - 1
    out, (after,) = RaggedKV(PS, 2)(jnp.asarray(q), k_new, v_new, (pool,), 1, page_rows, positions)
    k_want, v_want = (np.array(x) for x in (k_pages, v_pages))
    for n in range(N):
        page, offset = page_rows[n, positions[n] // PS], positions[n] % PS
        k_want[:, page, offset], v_want[:, page, offset] = k_new[n], v_new[n]
    np.testing.assert_allclose(out, dense_heads(q, k_want, v_want, page_rows, lengths), **close(atol=1e-5))
    assert not np.asarray(after[0]).any()  # layer 0 untouched


def test_ragged_kernel_refuses_only_what_it_cannot_do():
    """The one place the TPU path leaves the kernel: a float32 pool, a traced window, sink logits."""
    bf16, f32 = jnp.zeros((1,), jnp.bfloat16), jnp.zeros((1,), jnp.float32)
    assert RaggedKV.kernel_refuses(bf16, None, None) is None
    assert RaggedKV.kernel_refuses(bf16, 4096, None) is None
    assert "float32" in RaggedKV.kernel_refuses(f32, None, None)
    assert "traced window" in RaggedKV.kernel_refuses(bf16, jnp.int32(4), None)
    assert "sink" in RaggedKV.kernel_refuses(bf16, None, jnp.zeros(4))
