"""The critic's values of completion tokens (the value-side twin of rl_core.policy.logprobs).

Value t of a completion is the critic's estimate V(s_t) of the return before token t
is generated, read at the position whose hidden state predicts token t: the last
prompt token for t = 0, completion token t - 1 after that (verl's and Tunix's
alignment). Positions and the attention mask are the log-prob pass's.

The critic also reads how likely the behaviour policy was to write each token
(`written_logp`: the sampler's log-probs, always recorded with the rollout),
which a critic with a confidence head (rl_models.value) turns into features of
each prefix; the prompt's tokens and an environment's count as certain (0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl_core.policy.logprobs import scoring_inputs
from rl_core.policy.protocols import ValueFunction
from rl_core.types import TrainExample


def completion_values(
    model: ValueFunction,
    prompt_tokens: jax.Array,  # [B, P], left-padded
    prompt_mask: jax.Array,  # [B, P]
    completion_tokens: jax.Array,  # [B, T]
    completion_logp: jax.Array,  # [B, T] `written_logp`
) -> jax.Array:
    """Float32 values [B, T] of each completion token's state (before the token). The last
    completion token is not fed in: no state at or after it is valued."""
    tokens, positions, mask, outputs_from = scoring_inputs(prompt_tokens, prompt_mask, completion_tokens)
    token_logp = jnp.concatenate([jnp.zeros(prompt_tokens.shape, jnp.float32), completion_logp[:, :-1]], axis=1)
    return model(tokens, positions, mask, token_logp, outputs_from=outputs_from).astype(jnp.float32)


def written_logp(example: TrainExample) -> jax.Array:
    """[B, T] the sampler's log-prob of each completion token the policy wrote, 0 elsewhere
    (an environment's tokens in a multi-turn episode, padding): the critic's `completion_logp`."""
    if example.sampler_logp is None:
        raise ValueError("the critic reads the sampler's log-probs of the completions: the example has no "
                         "sampler_logp")
    return jnp.where(jnp.asarray(example.completion_mask) > 0, jnp.asarray(example.sampler_logp, jnp.float32), 0.0)
