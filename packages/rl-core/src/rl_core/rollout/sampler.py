"""Batched generation with a preallocated KV cache, in one jitted program.

Prefill writes the left-padded prompt into the cache; a `lax.while_loop`
then decodes one token per iteration and stops as soon as every row has
emitted EOS or reached `max_new_tokens`. The program depends only on
(batch, prompt bucket) shapes, so a run compiles a fixed handful of them; the
tokenizer's end and pad ids are its arguments, not constants, so a memory
check that compiles it before the tokenizer is read compiles the run's very
program (one persistent-cache entry).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rl_core.runtime import mesh as mesh_lib
from rl_core.runtime import multihost
from rl_core.config import RolloutConfig
from rl_core.policy.protocols import decode_cache, loop_policy, repeat_cache, routed_call


class Completions(NamedTuple):
    tokens: jax.Array  # [B, T] int32; pad after EOS
    logp: jax.Array  # [B, T] float32; sampler log-probs, 0 after EOS
    mask: jax.Array  # [B, T] float32; 1 up to and including EOS
    lengths: jax.Array  # [B] int32; tokens including EOS
    truncated: jax.Array  # [B] bool; no EOS within max_new_tokens
    version: jax.Array | None = None  # [B] int32; weight version that generated each row (set by a rollout backend)
    # [B, T] int32; the weight version that sampled each token, the row's last past its end (set with `version`;
    # one per row unless a partial rollout switched weights mid-row: rl_core.rollout.feed)
    token_version: jax.Array | None = None
    # [B, T, layers, k] int32; a mixture of experts' routing: for each token, the experts every layer's router
    # chose at the position that sampled it (the prompt's last for token 0, token t - 1's after), -1 past
    # the end; None for a dense model (routing replay: rl_core.policy.logprobs replays them)
    routing: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """What shapes the sampling distribution (static for compilation)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    @classmethod
    def from_rollout(cls, rollout: RolloutConfig) -> SamplingParams:
        return cls(rollout.temperature, rollout.top_k, rollout.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingParams(temperature=0.0)


def tempered_logits(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """float32 logits / temperature (untempered for greedy): the distribution the learner computes."""
    return logits.astype(jnp.float32) / (params.temperature or 1.0)


def filter_logits(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """Tempered float32 logits with top-k / top-p exclusions set to -inf."""
    logits = tempered_logits(logits, params)
    if params.top_k:
        kth = jax.lax.top_k(logits, params.top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if params.top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        cum = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
        # keep tokens until the cumulative mass first reaches top_p (the crossing token included)
        cutoff_index = jnp.sum(cum < params.top_p, axis=-1, keepdims=True)
        cutoff = jnp.take_along_axis(sorted_logits, cutoff_index, axis=-1)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return logits


def first_argmax(x: jax.Array) -> jax.Array:
    """`jnp.argmax(x, axis=-1)` as int32: the first index of the maximum, a NaN counting as the
    maximum. Single-operand reductions (a max, an any, a min) instead of argmax's (value, index)
    reduction, which XLA:CPU runs as a scalar loop: 2.5-3.5x faster on a [64, 99] sampling step.

    A row's NaNs are found by `isnan`, not by the max: whether a max reduction returns NaN when a
    NaN is among its inputs differs by backend (XLA:CPU's does; a TPU's need not, and then the
    first maximal number would win over a later NaN)."""
    n = x.shape[-1]
    nan = jnp.isnan(x)
    hit = jnp.where(jnp.any(nan, axis=-1, keepdims=True), nan, x == jnp.max(x, axis=-1, keepdims=True))
    return jnp.min(jnp.where(hit, jnp.arange(n, dtype=jnp.int32), n), axis=-1)


def categorical(key: jax.Array, logits: jax.Array) -> jax.Array:
    """`jax.random.categorical(key, logits, axis=-1)`, the same draws (Gumbel-max with the same
    noise), through `first_argmax`."""
    return first_argmax(jax.random.gumbel(key, logits.shape, logits.dtype) + logits)


def sample_with(draw: Callable[[jax.Array], jax.Array], logits: jax.Array,
                params: SamplingParams) -> tuple[jax.Array, jax.Array]:
    """(token [B], its log-prob [B] under the full tempered softmax); `draw` maps the
    filtered logits to tokens (the argmax when greedy).

    The token is drawn from the top-k / top-p truncated distribution, but its
    log-prob is reported under the whole tempered softmax, the distribution the
    learner computes (`completion_logprobs` at the same temperature): so the
    truncated importance weight exp(learner - sampler) and the `drift/*`
    metrics measure a real mismatch between the two (numerics, stale weights),
    not the mass top-p / top-k cut off, which would otherwise be most of it
    (top_p=0.9: mean weight 0.90; top_k=5: 0.35). The truncation itself is a
    bias of the sampling, not corrected for. Greedy reports the untempered log-prob.
    """
    filtered = filter_logits(logits, params)
    logp_all = jax.nn.log_softmax(tempered_logits(logits, params), axis=-1)
    token = first_argmax(filtered) if params.greedy else draw(filtered)
    return token, jnp.take_along_axis(logp_all, token[:, None], axis=-1)[:, 0]


def sample_token(key: jax.Array, logits: jax.Array, params: SamplingParams) -> tuple[jax.Array, jax.Array]:
    """(token [B], its log-prob [B]) with one key for all rows; see `sample_with`."""
    return sample_with(lambda filtered: categorical(key, filtered), logits, params)


def generate(
    model: nnx.Module,
    prompt_tokens: jax.Array,  # [B, P] left-padded
    prompt_mask: jax.Array,  # [B, P]
    key: jax.Array,
    *,
    max_new_tokens: int,
    eos_ids: Sequence[int] | jax.Array,
    pad_id: int | jax.Array,
    params: SamplingParams,
    num_samples: int = 1,
    shard_cache: Callable[[Any, Any], Any] = lambda cache, axes: cache,
) -> Completions:
    """Generate `num_samples` completions per prompt (trace inside jit; see `Sampler`).

    Row i * num_samples + j of the result is sample j of prompt i. Each prompt
    is prefilled once and its KV cache copied to its samples, so a GRPO group
    of G completions pays for one prefill, not G. The cache is the model's decode cache
    (`decode_cache`: a windowed layer keeps only its window's slots). `shard_cache(cache, axes)`
    lays out a cache on the devices (the Sampler splits it over rows and KV heads). `eos_ids`
    may hold negative fillers (no token is one); `eos_ids` and `pad_id` may be traced.
    """
    u, p = prompt_tokens.shape
    b = u * num_samples
    t_max = max_new_tokens
    slots = p + t_max
    eos = jnp.asarray(eos_ids, jnp.int32)
    valid_prompt = prompt_mask > 0
    prompt_len = jnp.sum(valid_prompt, axis=1).astype(jnp.int32)

    # Prefill: slot k holds prompt token k; decode slots follow at p + t.
    positions = jnp.maximum(jnp.cumsum(valid_prompt, axis=1) - 1, 0).astype(jnp.int32)
    slot_valid = jnp.concatenate([valid_prompt, jnp.ones((u, t_max), bool)], axis=1)  # [U, S]
    causal = jnp.arange(slots)[None, :] <= jnp.arange(p)[:, None]  # [P, S]
    cache, axes = decode_cache(model, u, slots)
    cache = shard_cache(cache, axes)
    hidden, cache, routed = routed_call(model, prompt_tokens, positions, causal[None] & slot_valid[:, None, :], cache,
                                        0, outputs_from=p - 1)
    first_logits = model.logits(hidden[:, -1])
    # a mixture of experts' routing of the step that sampled each token (-1 where none ran): [B, T, layers, k]
    first_routing = None if routed is None else jnp.swapaxes(routed.experts[:, :, -1], 0, 1)  # [U, layers, k]
    if num_samples > 1:  # every sample of a prompt continues from the prompt's cache
        cache = shard_cache(repeat_cache(model, cache, num_samples, axes), axes)
        first_logits, slot_valid, prompt_len, first_routing = jax.tree.map(
            lambda x: jnp.repeat(x, num_samples, axis=0), (first_logits, slot_valid, prompt_len, first_routing)
        )
    routing = None if first_routing is None else (
        jnp.full((b, t_max, *first_routing.shape[1:]), -1, jnp.int32).at[:, 0].set(first_routing))
    key, sub = jax.random.split(key)
    first, first_logp = sample_token(sub, first_logits, params)

    tokens = jnp.full((b, t_max), pad_id, jnp.int32).at[:, 0].set(first)
    logps = jnp.zeros((b, t_max), jnp.float32).at[:, 0].set(first_logp)
    done = jnp.isin(first, eos)
    in_loop = loop_policy(model)  # the weights made ready once, not at every token

    def cond(state):
        t, _, _, _, done, _, _ = state
        return (t < t_max - 1) & ~jnp.all(done)

    def body(state):
        t, cache, tokens, logps, done, key, routing = state
        last = jax.lax.dynamic_index_in_dim(tokens, t, axis=1, keepdims=True)  # [B, 1]
        slot = p + t
        mask = (jnp.arange(slots) <= slot)[None, None, :] & slot_valid[:, None, :]
        step_model = in_loop()
        hidden, cache, routed = routed_call(step_model, last, (prompt_len + t)[:, None], mask, cache, slot)
        key, sub = jax.random.split(key)
        token, logp = sample_token(sub, step_model.logits(hidden[:, 0]), params)
        token = jnp.where(done, pad_id, token)
        logp = jnp.where(done, 0.0, logp)
        tokens = jax.lax.dynamic_update_index_in_dim(tokens, token, t + 1, axis=1)
        logps = jax.lax.dynamic_update_index_in_dim(logps, logp, t + 1, axis=1)
        if routing is not None:
            chosen = jnp.where(done[:, None, None], -1, jnp.swapaxes(routed.experts[:, :, 0], 0, 1))  # [B, layers, k]
            routing = jax.lax.dynamic_update_index_in_dim(routing, chosen, t + 1, axis=1)
        return t + 1, cache, tokens, logps, done | jnp.isin(token, eos), key, routing

    state = (jnp.int32(0), cache, tokens, logps, done, key, routing)
    _, _, tokens, logps, done, _, routing = jax.lax.while_loop(cond, body, state)

    is_eos = jnp.isin(tokens, eos)
    # a token is real up to and including the first EOS
    eos_before = jnp.cumsum(is_eos, axis=1) - is_eos
    mask = (eos_before == 0).astype(jnp.float32)
    lengths = jnp.sum(mask, axis=1).astype(jnp.int32)
    if routing is not None:
        routing = jnp.where(mask[:, :, None, None] > 0, routing, -1)
    return Completions(tokens, logps * mask, mask, lengths, ~jnp.any(is_eos, axis=1), routing=routing)


EOS_SLOTS = 8
"""A sampler's program takes the end ids as an argument this wide (a multiple of it for more), filled
with -1: tokenizers name one to three, so its module is the same for every tokenizer of up to 8."""


@dataclasses.dataclass(frozen=True)
class SamplerProgram:
    """A Sampler's jitted program and its stop ids, which it takes as arguments: lowered as
    `(state, prompt_tokens, prompt_mask, key, params, num_samples)`, as the sampler is called."""

    jitted: Callable[..., Completions]
    stops: tuple[np.ndarray, np.ndarray]
    """(end ids [a multiple of EOS_SLOTS] int32 filled with -1, pad id [] int32)."""

    def lower(self, state, prompt_tokens, prompt_mask, key, params: SamplingParams, num_samples: int = 1):
        return self.jitted.lower(state, prompt_tokens, prompt_mask, key, self.stops, params, num_samples)


class Sampler:
    """Jitted generation for one model structure; call with its parameters.

    The jitted functions are built once, so their compile caches live as long as
    the sampler; `compiles` counts the distinct programs traced.

    With a `mesh` (and the parameters' shardings), every program states its
    layouts: parameters as given, prompt and completion rows split over
    (data, fsdp) when the devices divide them (else whole on every device), the
    KV cache split over rows and KV heads, the key replicated.
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        *,
        max_new_tokens: int,
        eos_ids: Sequence[int],
        pad_id: int,
        mesh: Mesh | None = None,
        param_shardings: Any = None,
    ) -> None:
        if not eos_ids:
            raise ValueError("eos_ids is empty: generation could never stop early")
        if (mesh is None) != (param_shardings is None):
            raise ValueError("give both mesh and param_shardings, or neither")
        self.graphdef = graphdef
        self.max_new_tokens = max_new_tokens
        eos = tuple(int(e) for e in eos_ids)
        self._stops = (np.array(eos + (-1,) * (-len(eos) % EOS_SLOTS), np.int32), np.array(pad_id, np.int32))
        self.mesh = mesh
        self.param_shardings = param_shardings
        self.compiles = 0
        # one jitted function per (prompt rows split, completion rows split) layout
        self._jitted: dict[tuple[bool, bool], SamplerProgram] = {}

    def _jit(self, split_in: bool, split_out: bool) -> SamplerProgram:
        key = (split_in, split_out)
        if key not in self._jitted:
            static = (5, 6)  # params, num_samples
            if self.mesh is None:
                jitted = jax.jit(self._traced, static_argnums=static)
            else:
                whole = mesh_lib.replicated(self.mesh)
                rows_in = mesh_lib.rows(self.mesh) if split_in else whole
                rows_out = mesh_lib.rows(self.mesh) if split_out else whole
                jitted = jax.jit(
                    self._traced,
                    static_argnums=static,
                    in_shardings=(self.param_shardings, rows_in, rows_in, whole, whole),
                    out_shardings=rows_out,
                )
            self._jitted[key] = SamplerProgram(jitted, self._stops)
        return self._jitted[key]

    def _shard_cache(self, cache: Any, axes: Any) -> Any:
        if self.mesh is None:
            return cache
        shardings = jax.tree.map(
            lambda x, names: mesh_lib.logical_sharding(tuple(names), x.shape, self.mesh), cache, axes
        )
        return jax.lax.with_sharding_constraint(cache, shardings)

    def _traced(
        self, state, prompt_tokens, prompt_mask, key, stops, params: SamplingParams, num_samples: int = 1
    ) -> Completions:
        self.compiles += 1  # runs once per trace, i.e. per compiled program
        model = nnx.merge(self.graphdef, state)
        return generate(
            model,
            prompt_tokens,
            prompt_mask,
            key,
            max_new_tokens=self.max_new_tokens,
            eos_ids=stops[0],
            pad_id=stops[1],
            params=params,
            num_samples=num_samples,
            shard_cache=self._shard_cache,
        )

    def __call__(
        self, state, prompt_tokens, prompt_mask, key, params: SamplingParams, num_samples: int = 1
    ) -> Completions:
        """`num_samples` completions per prompt row; see `generate`."""
        if num_samples < 1:
            raise ValueError(f"num_samples={num_samples}: must be >= 1")
        ways = 1 if self.mesh is None else mesh_lib.batch_devices(self.mesh)
        u = len(prompt_tokens)
        split_in = u % ways == 0
        if self.mesh is not None:  # global arrays: each process places the prompt rows of its own devices
            rows = mesh_lib.rows(self.mesh) if split_in else mesh_lib.replicated(self.mesh)
            prompt_tokens, prompt_mask = multihost.program_inputs((prompt_tokens, prompt_mask), rows)
            key, stops = multihost.program_inputs((key, self._stops), mesh_lib.replicated(self.mesh))
        else:
            stops = self._stops
        run = self._jit(split_in, u * num_samples % ways == 0)
        return run.jitted(state, prompt_tokens, prompt_mask, key, stops, params, num_samples)


