"""The critic's values of completion tokens (the value-side twin of rl_core.logprobs).

Value t of a completion is the critic's estimate V(s_t) of the return before token t
is generated, read at the position whose hidden state predicts token t: the last
prompt token for t = 0, completion token t - 1 after that (verl's and Tunix's
alignment). Positions and the attention mask are the log-prob pass's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl_core.logprobs import sequence_inputs
from rl_core.policy import ValueFunction


def completion_values(
    model: ValueFunction,
    prompt_tokens: jax.Array,  # [B, P], left-padded
    prompt_mask: jax.Array,  # [B, P]
    completion_tokens: jax.Array,  # [B, T]
) -> jax.Array:
    """Float32 values [B, T] of each completion token's state (before the token)."""
    p = prompt_tokens.shape[1]
    t = completion_tokens.shape[1]
    positions, mask = sequence_inputs(prompt_mask, t)
    values = model(jnp.concatenate([prompt_tokens, completion_tokens], axis=1), positions, mask)
    return values[:, p - 1 : p + t - 1].astype(jnp.float32)
