"""rl_core.policy.traits: rl_models' transformer and its paged adapter declare every optional
ability by having its method; the toy policy and its adapter have none, and the helpers of
rl_core.policy.protocols take the plain path for them."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.policy import traits
from rl_core.policy.logprobs import sequence_inputs
from rl_core.policy.protocols import chunk_unembedding, decode_cache, loop_policy, routed_call
from rl_core.testing import BAG_PAGING, BagPolicy
from rl_models import PAGED_TRANSFORMER, Transformer, TransformerConfig

POLICY_TRAITS = (traits.RoutedPolicy, traits.ChunkUnembedding, traits.LoopView, traits.DecodeCache)
PAGING_TRAITS = (traits.RoutedPaging, traits.WindowedPaging, traits.StatefulPaging, traits.ShardedStates,
                 traits.ChunkSharingStates, traits.LoopStackedPaging)
TOKENS = jnp.asarray([[5, 6, 7, 8]], jnp.int32)


def moe():
    config = TransformerConfig.tiny(40, num_experts=4, experts_per_token=2, moe_hidden_size=24)
    return Transformer(config, rngs=nnx.Rngs(0))


def test_the_transformer_and_its_adapter_have_every_ability_the_toy_none():
    model = moe()
    assert [isinstance(model, t) for t in POLICY_TRAITS] == [True] * 4
    assert [isinstance(PAGED_TRANSFORMER, t) for t in PAGING_TRAITS] == [True] * 6
    bag = BagPolicy(40, rngs=nnx.Rngs(0))
    assert [isinstance(bag, t) for t in POLICY_TRAITS] == [False] * 4
    assert [isinstance(BAG_PAGING, t) for t in PAGING_TRAITS] == [False] * 6


def test_the_helpers_take_the_ability_when_there_and_the_plain_path_else():
    model, bag = moe(), BagPolicy(40, rngs=nnx.Rngs(0))
    positions, mask = sequence_inputs(jnp.ones_like(TOKENS), 0)
    hidden, _, routing = routed_call(model, TOKENS, positions, mask)
    assert routing.experts.shape == (2, 1, 4, 2)  # [layers, B, L, k]: the tiny model's two layers
    np.testing.assert_array_equal(hidden, model(TOKENS, positions, mask)[0])
    bag_hidden, _, none = routed_call(bag, TOKENS, positions, mask)
    assert none is None
    np.testing.assert_array_equal(bag_hidden, bag(TOKENS, positions, mask)[0])
    with pytest.raises(ValueError, match="BagPolicy has no routed"):
        routed_call(bag, TOKENS, positions, mask, replay=jnp.zeros((2, 1, 4, 2), jnp.int32))
    # the chunk unembedding and the loop view compute what the plain model does
    np.testing.assert_allclose(chunk_unembedding(model)(hidden), model.logits(hidden), atol=1e-6)
    assert chunk_unembedding(bag) == bag.logits
    assert loop_policy(bag)() is bag
    np.testing.assert_allclose(loop_policy(model)()(TOKENS, positions, mask)[0], hidden, atol=1e-6)
    # the toy's decode cache is its plain cache: [B, S, D] embeddings
    cache, axes = decode_cache(bag, 3, 9)
    assert cache.shape == (3, 9, 8) and axes == bag.cache_axes()
