"""Rollout engines on a model's weights, and what greedy decoding must produce: the helpers the
engine tests (dense families, Qwen3.5, routing replay) share."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.sampler import Sampler
from rl_core.rollout.static import StaticBackend
from rl_models import PAGED_TRANSFORMER


def static_engine(model: Any, *, max_new_tokens: int, eos_ids: tuple[int, ...], version: int = 1) -> StaticBackend:
    """The static sampler holding `model`'s weights as `version`."""
    graphdef, state = nnx.split(model)
    backend = StaticBackend(Sampler(graphdef, max_new_tokens=max_new_tokens, eos_ids=eos_ids, pad_id=0))
    backend.update_weights(state, version)
    return backend


def paged_engine(model: Any, settings: dict[str, Any], *, eos_ids: tuple[int, ...], version: int = 1,
                 **kwargs: Any) -> PagedBackend:
    """The paged engine with `EngineSettings(**settings)` holding `model`'s weights as `version`."""
    graphdef, state = nnx.split(model)
    engine = PagedBackend(graphdef, EngineSettings(**settings), paging=PAGED_TRANSFORMER, eos_ids=eos_ids, pad_id=0,
                          **kwargs)
    engine.update_weights(state, version)
    return engine


def full_forward_greedy(model: Any, tokens: Any, mask: Any, completions: Any) -> np.ndarray:
    """Each completion token the full forward pass over prompt + completion predicts (argmax of
    the logits one position earlier): what greedy decoding must have generated."""
    seq = jnp.concatenate([jnp.asarray(tokens), jnp.asarray(completions)], axis=1)
    valid = jnp.concatenate([jnp.asarray(mask, bool), jnp.ones(completions.shape, bool)], axis=1)
    positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
    length = seq.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))[None] & valid[:, None, :]
    hidden, _ = jax.jit(lambda m: m(seq, positions, causal))(model)
    p = tokens.shape[1]
    return np.asarray(jnp.argmax(model.logits(hidden[:, p - 1 : -1]), axis=-1))
