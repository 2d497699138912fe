"""A value model (critic): the transformer's backbone with a scalar head.

`ValueModel(tokens, positions, attention_mask)` returns one float32 value per
position, v_j = h_j . w + b from the final-norm hidden state h_j (implementing
`rl_core.policy.ValueFunction`). The head starts at zero (w = 0, b = 0), so a
fresh critic predicts 0 everywhere and its first gradients reach only the head;
the backbone has no unembedding (a critic never computes logits).

`value_model_from_policy` makes a critic over a policy's backbone, as verl and
OpenRLHF start theirs from the actor's weights: every base array is shared, not
copied (a learner trains its own float32 copy of a fully trained critic). With
LoRA the critic gets its own fresh adapters on the same projections, and its head
is marked `train_with_adapters`, so it trains adapters plus head over the very
frozen base the policy uses (rl_core.frozen): no second copy of the base exists.
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


class ValueModel(nnx.Module):
    """A backbone (a `Transformer` without unembedding) and a zero-initialised `ValueHead`."""

    def __init__(self, backbone: Transformer) -> None:
        backbone.lm_head = None  # a critic never unembeds: no parameters, no optimizer state for it
        self.backbone = backbone
        self.value_head = ValueHead(backbone.config.hidden_size)

    @property
    def config(self):  # noqa: ANN201 - the backbone's TransformerConfig
        return self.backbone.config

    def __call__(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """Float32 values [B, L], one per position."""
        hidden, _ = self.backbone(tokens, positions, attention_mask)
        return self.value_head(hidden)


def value_model_from_policy(policy: Transformer, *, seed: int = 1) -> ValueModel:
    """A critic over `policy`'s backbone, sharing its arrays (the policy is left as it is).

    With adapters, the critic's are fresh (A drawn with `seed`, B zero) on the same projections.
    """
    graphdef, state = nnx.split(policy)
    # new Variables over the same arrays: nothing the critic sets reaches the policy's module
    state = jax.tree.map(lambda v: v.replace(v[...]), state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    backbone = nnx.merge(graphdef, state)
    lora.redraw_adapters(backbone, seed=seed)
    return ValueModel(backbone)
