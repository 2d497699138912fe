"""Per-token log-probs and entropy of completions, unembedded in chunks.

The [B, T, V] float32 logits are never materialized: the body returns hidden
states [B, P+T, D] and the unembedding runs over T in chunks of C tokens
inside a rematerialized scan, so memory holds [B, C, V] at a time, forward
and backward.

When the rows come in groups sharing a prompt (`SharedPrompts`), each prompt runs
once per group: it fills a KV cache that the group's rows copy and continue from,
as the sampler's prefill does. The copy is differentiable, so the prompt's
gradient is the sum of its rows' (GRPO with G = 8: the prompt positions cost 1/8).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rl_core.runtime import mesh as mesh_lib
from rl_core.packed import Packed, unpack
from rl_core.policy.protocols import Policy, chunk_unembedding, repeat_cache, routed_call
from rl_core.types import SharedPrompts


def sequence_inputs(prompt_mask: jax.Array, completion_len: int) -> tuple[jax.Array, jax.Array]:
    """(positions [B, P+T], attention mask [B, P+T, P+T]) for prompt + completion.

    Positions count real tokens only (left padding takes none), matching the
    sampler; queries attend to real earlier slots.
    """
    b = prompt_mask.shape[0]
    valid = jnp.concatenate([prompt_mask > 0, jnp.ones((b, completion_len), bool)], axis=1)
    positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0).astype(jnp.int32)
    length = valid.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    return positions, causal[None] & valid[:, None, :]


def scoring_inputs(prompt_tokens: jax.Array, prompt_mask: jax.Array, completion_tokens: jax.Array
                   ) -> tuple[jax.Array, jax.Array, jax.Array, int]:
    """(tokens, positions, attention mask, outputs_from) of the pass that scores completions:
    its outputs, positions p - 1 .. p + T - 2, are the states before each completion token. The
    last completion token is never fed in (no output reads a state at or after it)."""
    positions, mask = sequence_inputs(prompt_mask, completion_tokens.shape[1] - 1)
    tokens = jnp.concatenate([prompt_tokens, completion_tokens[:, :-1]], axis=1)
    return tokens, positions, mask, prompt_tokens.shape[1] - 1


def token_logprobs(logits: jax.Array, targets: jax.Array, temperature: float) -> tuple[jax.Array, jax.Array]:
    """log p(target) and entropy under softmax(logits / temperature), float32."""
    logits = logits.astype(jnp.float32) / temperature
    logz = jax.nn.logsumexp(logits, axis=-1)
    logp_all = logits - logz[..., None]
    logp = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return logp, entropy


def completion_logprobs(
    model: Policy,
    prompt_tokens: jax.Array,  # [B, P]
    prompt_mask: jax.Array,  # [B, P]
    completion_tokens: jax.Array,  # [B, T]
    routing: jax.Array | None = None,  # [B, T, layers, k] int32: experts to replay (Completions.routing)
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 64,
    packed: Packed | None = None,
    shared: SharedPrompts | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(logp [B, T], entropy [B, T]) of each completion token given what precedes it.

    `temperature` must match the sampler's so that the ratio to sampler
    log-probs is 1 for an unchanged policy. Greedy sampling (0) scores at 1.
    With the sequences `packed` (rl_core.train.packing), the pass runs on the packed rows
    (`packed_logprobs`: equal on the tokens of the packing's completion masks).
    With the prompts `shared` by consecutive groups of rows, each runs once
    (`shared_prompt_hidden`: the same log-probs and gradients).
    With `routing` (a mixture of experts' rollout routing), the routers take the recorded experts
    at the position that sampled each completion token (`routing_replay`).
    """
    logp, entropy, _ = routed_completion_logprobs(model, prompt_tokens, prompt_mask, completion_tokens, routing,
                                                  temperature=temperature, chunk_tokens=chunk_tokens, packed=packed,
                                                  shared=shared)
    return logp, entropy


def routed_completion_logprobs(
    model: Policy,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    completion_tokens: jax.Array,
    routing: jax.Array | None = None,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 64,
    packed: Packed | None = None,
    shared: SharedPrompts | None = None,
) -> tuple[jax.Array, jax.Array, Any]:
    """`completion_logprobs`, and a mixture of experts' routing at the positions that predict the
    completion tokens (the model's `Routing`, fields [layers, B, T, ...]; None for a dense model or
    packed rows): what the router's load-balancing loss reads."""
    if packed is not None:
        if routing is not None:
            raise ValueError("routing replay does not run on packed rows: set training.packing=false")
        logp, entropy = packed_logprobs(model, packed, completion_tokens, temperature=temperature,
                                        chunk_tokens=chunk_tokens)
        return logp, entropy, None
    if shared is not None:
        hidden, routed = shared_prompt_hidden(model, shared, prompt_mask, completion_tokens, routing)
    else:
        tokens, positions, mask, outputs_from = scoring_inputs(prompt_tokens, prompt_mask, completion_tokens)
        hidden, _, routed = routed_call(model, tokens, positions, mask, outputs_from=outputs_from,
                                        replay=replay_of(routing, outputs_from))  # [B, T, D]
    logp, entropy = chunked_logprobs(model, hidden, completion_tokens, temperature=temperature,
                                     chunk_tokens=chunk_tokens)
    return logp, entropy, routed


def replay_of(routing: jax.Array | None, before: int) -> jax.Array | None:
    """The `replay` [layers, B, before + T', k] of a call whose first `before` positions route freely
    (-1) and whose next T' take the recorded routing [B, T', layers, k] (routing replay: the
    position that sampled completion token t is replayed with the experts recorded for t)."""
    if routing is None:
        return None
    r = jnp.moveaxis(jnp.asarray(routing, jnp.int32), 2, 0)  # [layers, B, T', k]
    free = jnp.full((r.shape[0], r.shape[1], before, r.shape[3]), -1, jnp.int32)
    return jnp.concatenate([free, r], axis=2)


def shared_prompt_hidden(model: Policy, shared: SharedPrompts, prompt_mask: jax.Array,
                         completion_tokens: jax.Array, routing: jax.Array | None = None) -> tuple[jax.Array, Any]:
    """The scoring pass's hidden states [B, T, D] (as `scoring_inputs`' pass gives them) with each
    group's prompt run once: rows i * G .. i * G + G - 1 share prompt i of `shared` (G = B / U),
    and its routing (`routed_completion_logprobs`).

    The prompts [U, P] fill a KV cache and give the state before each group's first completion
    token; the cache is copied to the group's rows, which run their completions but the last
    token on it. `prompt_mask` [B, P] is the rows' (the group's, repeated). `routing` [B, T, layers,
    k]: replayed (the prompt's last position takes the group's first row's record: the same prompt,
    routed once by the engine)."""
    u, p = shared.tokens.shape
    b, t = completion_tokens.shape
    if b % u:
        raise ValueError(f"{b} rows cannot share {u} prompts in equal groups")
    g = b // u
    slots = p + t - 1

    def laid_out(cache):  # split like the rows (and KV heads), never over slots
        return jax.tree.map(lambda x, names: mesh_lib.traced_layout(x, tuple(names)), cache, model.cache_axes())

    positions, mask = sequence_inputs(shared.mask, t - 1)
    cache = laid_out(model.init_cache(u, slots))
    first_replay = None if routing is None else replay_of(routing[::g, :1], p - 1)
    first, cache, first_routed = routed_call(model, shared.tokens, positions[:, :p], mask[:, :p], cache, 0,
                                             outputs_from=p - 1, replay=first_replay)  # [U, 1, D]
    repeat = lambda x, axis: jnp.repeat(x, g, axis=axis)  # noqa: E731  each group's to its g rows
    first = repeat(first, 0)
    first_routed = jax.tree.map(lambda x: repeat(x, 1), first_routed)
    if t == 1:
        return first, first_routed
    cache = laid_out(repeat_cache(model, cache, g))
    positions, mask = sequence_inputs(prompt_mask, t - 1)
    rest, _, rest_routed = routed_call(model, completion_tokens[:, :-1], positions[:, p:], mask[:, p:], cache, p,
                                       replay=replay_of(None if routing is None else routing[:, 1:], 0))
    routed = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=2), first_routed, rest_routed)
    return jnp.concatenate([first, rest], axis=1), routed  # [B, T - 1, D] after the first


def packed_logprobs(
    model: Policy,
    packed: Packed,  # rl_core.train.packing: the sequences of the batch packed into rows
    completion_tokens: jax.Array,  # [B, T]
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 64,
) -> tuple[jax.Array, jax.Array]:
    """`completion_logprobs` over packed rows: (logp [B, T], entropy [B, T]), equal on every
    token of the packing's completion masks; elsewhere placeholders (mask them). Traced under
    a mesh's activation layout, the rows are packed per device (rl_core.train.packing)."""
    hidden, _ = model(packed.tokens, packed.positions, packed.attention_mask())
    hidden = unpack(hidden, packed.index, mesh_lib.traced_row_shards())  # [B, T, D]
    return chunked_logprobs(model, hidden, completion_tokens, temperature=temperature, chunk_tokens=chunk_tokens)


def chunked_logprobs(model: Policy, hidden: jax.Array, targets: jax.Array, *, temperature: float = 1.0,
                     chunk_tokens: int = 64) -> tuple[jax.Array, jax.Array]:
    """(logp [B, T], entropy [B, T]) of targets [B, T] from the hidden states [B, T, D] that
    predict them, unembedded C tokens at a time."""
    temperature = temperature or 1.0
    b, t = targets.shape
    chunk = min(chunk_tokens, t)
    n_chunks = -(-t // chunk)
    pad = n_chunks * chunk - t
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    hidden = hidden.reshape(b, n_chunks, chunk, -1).swapaxes(0, 1)
    targets = targets.reshape(b, n_chunks, chunk).swapaxes(0, 1)

    unembed = chunk_unembedding(model)  # outside the loop: a sharded weight is gathered once

    @jax.checkpoint  # recompute each chunk's logits in the backward pass instead of storing them
    def one_chunk(h, y):
        return token_logprobs(unembed(h), y, temperature)

    def body(_, xs):
        return None, one_chunk(*xs)

    _, (logp, entropy) = jax.lax.scan(body, None, (hidden, targets))
    logp = logp.swapaxes(0, 1).reshape(b, -1)[:, :t]
    entropy = entropy.swapaxes(0, 1).reshape(b, -1)[:, :t]
    return logp, entropy
