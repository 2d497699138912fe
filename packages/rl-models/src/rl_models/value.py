"""A value model (critic): the transformer's backbone, a scalar head and a confidence head.

`ValueModel(tokens, positions, attention_mask, token_logp)` returns one float32
value per position (implementing `rl_core.policy.protocols.ValueFunction`):

    v_j = h_j . w + b  +  u . gelu(phi_j W + a)

h_j the final-norm hidden state. phi_j (`prefix_confidence`) is what the
behaviour policy's own log-probs say of tokens 0..j: the probability of the
prefix it wrote, of its least likely token and of the last one. They tell a
slip (a token sampled against the policy's own odds) from an answer the policy
was sure of, which the backbone would otherwise have to learn to see by
re-checking every token from 0/1 outcomes; on the built-in task they double the
critic's explained variance early in training (algo-ppo's README). w, b and u
start at zero, so a fresh critic predicts 0 everywhere and its first gradients
reach only the heads; the backbone has no unembedding (a critic never computes
logits). `confidence=False` drops the second term (the plain scalar head).

`value_model_from_policy` makes a critic over a policy's backbone, as verl and
OpenRLHF start theirs from the actor's weights: every base array is shared, not
copied (a learner trains its own float32 copy of a fully trained critic). With
LoRA the critic gets its own fresh adapters on the same projections, and its heads
are marked `train_with_adapters`, so it trains adapters plus heads over the very
frozen base the policy uses (rl_core.policy.frozen): no second copy of the base exists.
`rl_models.hf.load_hf_value_model` starts one from a Hugging Face folder.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rl_models import lora
from rl_models.transformer import Transformer


class ValueHead(nnx.Module):
    """v = h . w + b in float32; w [D] and b [] start at zero and train beside adapters."""

    def __init__(self, hidden_size: int) -> None:
        meta = {"eager_sharding": False, "train_with_adapters": True}
        self.kernel = nnx.Param(jnp.zeros((hidden_size,), jnp.float32), out_sharding=("embed",), **meta)
        self.bias = nnx.Param(jnp.zeros((), jnp.float32), out_sharding=(), **meta)

    def __call__(self, hidden: jax.Array) -> jax.Array:
        h = hidden.astype(jnp.float32)
        return jnp.einsum("...d,d->...", h, self.kernel[...]) + self.bias[...]


CONFIDENCE_FEATURES = 3


def prefix_confidence(token_logp: jax.Array) -> jax.Array:
    """[B, L, 3] float32: for entry j, over tokens 0..j, exp of (the sum of their log-probs, the
    least of them, token j's own). token_logp [B, L] is the behaviour policy's log-prob of each
    token, 0 where it did not write the token (prompt, environment): those count as certain."""
    lp = token_logp.astype(jnp.float32)
    return jnp.exp(jnp.stack([jnp.cumsum(lp, axis=1), jax.lax.cummin(lp, axis=1), lp], axis=-1))


class ConfidenceHead(nnx.Module):
    """c = u . gelu(phi W + a) over `prefix_confidence` features; u starts at zero."""

    def __init__(self, hidden: int = 64, *, seed: int = 0) -> None:
        meta = {"eager_sharding": False, "train_with_adapters": True}
        w = jax.random.normal(jax.random.PRNGKey(seed), (CONFIDENCE_FEATURES, hidden), jnp.float32)
        self.kernel = nnx.Param(w / CONFIDENCE_FEATURES**0.5, out_sharding=(None, None), **meta)
        self.bias = nnx.Param(jnp.zeros((hidden,), jnp.float32), out_sharding=(None,), **meta)
        self.out = nnx.Param(jnp.zeros((hidden,), jnp.float32), out_sharding=(None,), **meta)

    def __call__(self, features: jax.Array) -> jax.Array:
        hidden = jax.nn.gelu(features @ self.kernel[...] + self.bias[...])
        return jnp.einsum("...h,h->...", hidden, self.out[...])


class ValueModel(nnx.Module):
    """A backbone (a `Transformer` without unembedding), a zero-initialised `ValueHead` and,
    unless `confidence=False`, a `ConfidenceHead` over the policy's log-probs (module docstring)."""

    def __init__(self, backbone: Transformer, *, confidence: bool = True, seed: int = 0) -> None:
        backbone.lm_head = None  # a critic never unembeds: no parameters, no optimizer state for it
        self.backbone = backbone
        self.value_head = ValueHead(backbone.config.hidden_size)
        self.confidence_head = ConfidenceHead(seed=seed) if confidence else None

    @property
    def config(self):  # noqa: ANN201 - the backbone's TransformerConfig
        return self.backbone.config

    def __call__(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                 token_logp: jax.Array | None = None, *, outputs_from: int = 0) -> jax.Array:
        """Float32 values [B, L - outputs_from], one per position from `outputs_from` on (the
        backbone's `outputs_from`); `token_logp` [B, L] (see `prefix_confidence`) is required when
        the critic reads the policy's confidence and unused otherwise."""
        hidden, _ = self.backbone(tokens, positions, attention_mask, outputs_from=outputs_from)
        values = self.value_head(hidden)
        if self.confidence_head is None:
            return values
        if token_logp is None or token_logp.shape != tokens.shape:
            got = None if token_logp is None else token_logp.shape
            raise ValueError(f"this critic reads the policy's confidence: token_logp must be the behaviour log-prob "
                             f"of each token, shaped like tokens {tokens.shape} (0 where the policy did not write "
                             f"it); got {got}")
        return values + self.confidence_head(prefix_confidence(token_logp)[:, outputs_from:])


def value_model_from_policy(policy: Transformer, *, seed: int = 1, confidence: bool = True) -> ValueModel:
    """A critic over `policy`'s backbone, sharing its arrays (the policy is left as it is).

    With adapters, the critic's are fresh (A drawn with `seed`, B zero) on the same projections;
    `seed` also draws the confidence head's hidden layer.
    """
    graphdef, state = nnx.split(policy)
    # new Variables over the same arrays: nothing the critic sets reaches the policy's module
    state = jax.tree.map(lambda v: v.replace(v[...]), state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    backbone = nnx.merge(graphdef, state)
    lora.redraw_adapters(backbone, seed=seed)
    return ValueModel(backbone, confidence=confidence, seed=seed)
