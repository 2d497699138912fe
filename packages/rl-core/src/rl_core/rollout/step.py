"""One device call of the paged engine: a prefill chunk, then a few decode steps.

Every array has a fixed shape per engine configuration (C prefill tokens, S
decode slots, M pages per sequence, k steps), so the call compiles once per
(configuration, sampling parameters), whatever the requests.

Shapes: S slots, C prefill tokens, M pages per sequence, k decode steps, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rl_core.policy.protocols import PagedModel
from rl_core.policy.traits import RoutedPaging
from rl_core.rollout.sampler import SamplingParams, categorical, sample_with, tempered_logits


class Prefill(NamedTuple):
    """C prompt tokens to write into the pool (padding: token 0 at position 0 of page row 0s)."""

    tokens: jax.Array  # [C] int32
    positions: jax.Array  # [C] int32
    page_rows: jax.Array  # [C, M] int32
    state_rows: jax.Array  # [C] int32, the state row of each token's sequence (a model with one; 0: padding)


class Slots(NamedTuple):
    """The decode slots; an inactive slot computes on scratch page 0 and emits nothing."""

    token: jax.Array  # [S] int32, the next input token
    position: jax.Array  # [S] int32, its position in the sequence
    count: jax.Array  # [S] int32, tokens generated so far
    limit: jax.Array  # [S] int32, most tokens this slot may generate
    active: jax.Array  # [S] bool
    page_rows: jax.Array  # [S, M] int32
    ids: jax.Array  # [S, 2] int32, (prompt id, sample index): the completion's key (see `completion_keys`)
    state_row: jax.Array  # [S] int32, the slot's state row (a model with a recurrent state; else 0)
    state_from: jax.Array  # [S] int32, the row copied into it before decoding (its prompt's; 0: none)


def completion_keys(key: jax.Array, ids: jax.Array) -> jax.Array:
    """One key per row of ids [S, 2] = (prompt id, sample index): fold_in(fold_in(key, prompt), sample).

    Derived only from the run's key and the completion's identity, so a completion is the
    same whatever batch it is decoded in; its token t draws with fold_in(that key, t).
    """
    return jax.vmap(lambda i: jax.random.fold_in(jax.random.fold_in(key, i[0]), i[1]))(ids)


def sample_rows(keys: jax.Array, logits: jax.Array, params: SamplingParams) -> tuple[jax.Array, jax.Array]:
    """(token [S], log-prob [S]) with one key per row (`rl_core.rollout.sampler.sample_token` has one
    key for all rows); see `rl_core.rollout.sampler.sample_with`."""
    return sample_with(lambda filtered: jax.vmap(categorical)(keys, filtered), logits, params)


def engine_step(
    model: Callable[[], Any],
    pages: Any,
    prefill: Prefill,
    copy_src: jax.Array,  # [S] int32 pages copied to copy_dst before decoding (0 -> 0: nothing)
    copy_dst: jax.Array,  # [S] int32
    slots: Slots,
    key: jax.Array,
    kv: Any,
    *,
    paging: PagedModel,
    steps: int,
    sampling: SamplingParams,
    eos_ids: Sequence[int],
    pad_id: int,
    run_prefill: jax.Array | None = None,
    top_logprobs: int = 0,
) -> tuple[Any, jax.Array, jax.Array, Slots, tuple[jax.Array, jax.Array], jax.Array | None]:
    """(pages, tokens [S, k], log-probs [S, k], slots after the k steps, top, routing); `model()` (an
    inference copy, made where it runs: see `rl_core.rollout.unstacked`) runs through `paging.forward`.
    `pages` is (the KV pool, the state pool): a model with a recurrent state (`paging.state_spec`)
    keeps one row of it per sequence, read and written by `paging.forward` (each prefill chunk is
    one prompt's tokens); the state pool of a model without one is empty.
    `routing` [S, k, layers, E_k] int32: with a `RoutedPaging` paging, whose `forward_routed` reports a mixture
    of experts' choices, the experts of the step that sampled each token (-1 where none was sampled;
    None otherwise); with a state pool it takes it as `forward` does.
    `top` = (ids, log-probs) [S, k, K] of the K = `top_logprobs` likeliest tokens at each step under
    the whole tempered softmax (the sampled token's distribution; K = 0: empty, nothing computed).

    The prefill chunk goes first, so the samples of a prompt whose last chunk it
    holds may start decoding in the same call; then each new sample's copy of its
    prompt's partly filled last page (samples append, so a shared page must be full).
    `run_prefill` (default: whether the chunk holds a token) says whether to run the chunk.
    """

    stateful = bool(jax.tree.leaves(pages[1]))
    routed = paging.forward_routed if isinstance(paging, RoutedPaging) else None

    def forward(m, tokens, positions, pages, page_rows, state_rows, sequence):
        """(hidden, (the KV pool, the state pool), the experts each layer chose or None)."""
        if stateful:
            state = {"states": pages[1], "state_rows": state_rows, "sequence": sequence}
            if routed is not None:
                return routed(m, tokens, positions, pages[0], page_rows, kv, **state)
            hidden, pages = paging.forward(m, tokens, positions, pages[0], page_rows, kv, **state)
            return hidden, pages, None
        if routed is not None:
            hidden, pool, experts = routed(m, tokens, positions, pages[0], page_rows, kv)
            return hidden, (pool, pages[1]), experts
        hidden, pool = paging.forward(m, tokens, positions, pages[0], page_rows, kv)
        return hidden, (pool, pages[1]), None

    def prefill_chunk(pages):
        return forward(model(), prefill.tokens, prefill.positions, pages, prefill.page_rows, prefill.state_rows,
                       True)[1]

    # most calls have no prompt to prefill (padding is all-zero page rows): skip the chunk's forward
    if run_prefill is None:
        run_prefill = jnp.any(prefill.page_rows > 0)
    pages = jax.lax.cond(run_prefill, prefill_chunk, lambda pages: pages, pages)
    pages = (kv.copy_pages(pages[0], copy_src, copy_dst),
             # each new sample's state: a copy of its prompt's (the rows of other slots copy scratch onto scratch)
             jax.tree.map(lambda x: x.at[:, jnp.where(slots.state_from > 0, slots.state_row, 0)].set(
                 x[:, slots.state_from]), pages[1]))
    eos = jnp.asarray(tuple(eos_ids), jnp.int32)
    s = slots.token.shape[0]
    row_keys = completion_keys(key, slots.ids)

    def body(i, carry):
        pages, st, out_tokens, out_logp, (top_ids, top_logp), out_routing = carry
        rows = jnp.where(st.active[:, None], st.page_rows, 0)
        position = jnp.where(st.active, st.position, 0)
        step_model = model()
        hidden, pages, experts = forward(step_model, st.token, position, pages, rows,
                                         jnp.where(st.active, st.state_row, 0), False)
        if out_routing is not None:
            chosen = jnp.where(st.active[:, None, None], experts, -1)
            out_routing = jax.lax.dynamic_update_index_in_dim(out_routing, chosen, i, axis=1)
        keys = jax.vmap(jax.random.fold_in)(row_keys, st.count)
        logits = step_model.logits(hidden)
        token, logp = sample_rows(keys, logits, sampling)
        if top_logprobs:
            values, ids = jax.lax.top_k(jax.nn.log_softmax(tempered_logits(logits, sampling), axis=-1), top_logprobs)
            top_ids = jax.lax.dynamic_update_index_in_dim(top_ids, ids.astype(jnp.int32), i, axis=1)
            top_logp = jax.lax.dynamic_update_index_in_dim(top_logp, values, i, axis=1)
        token = jnp.where(st.active, token, pad_id)
        logp = jnp.where(st.active, logp, 0.0)
        out_tokens = jax.lax.dynamic_update_index_in_dim(out_tokens, token, i, axis=1)
        out_logp = jax.lax.dynamic_update_index_in_dim(out_logp, logp, i, axis=1)
        step = st.active.astype(jnp.int32)
        count = st.count + step
        ended = jnp.isin(token, eos) | (count >= st.limit)
        st = st._replace(token=jnp.where(st.active, token, st.token), position=st.position + step, count=count,
                         active=st.active & ~ended)
        return pages, st, out_tokens, out_logp, (top_ids, top_logp), out_routing

    top = (jnp.zeros((s, steps, top_logprobs), jnp.int32), jnp.zeros((s, steps, top_logprobs), jnp.float32))
    experts = jax.eval_shape(lambda p: forward(model(), slots.token, slots.position, p, slots.page_rows,
                                                slots.state_row, False)[2], pages)
    routing = None if experts is None else jnp.full((s, steps, *experts.shape[1:]), -1, jnp.int32)
    init = (pages, slots, jnp.full((s, steps), pad_id, jnp.int32), jnp.zeros((s, steps), jnp.float32), top, routing)
    pages, slots, tokens, logp, top, routing = jax.lax.fori_loop(0, steps, body, init)
    return pages, tokens, logp, slots, top, routing
