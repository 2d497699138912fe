"""rl_models.value: the critic is the policy's backbone and a zero-initialised scalar head.

Model-level facts; the learner's (the critic trains, its base stays bit-identical and
shared with the policy's) are in tests/algos/test_algo_ppo.py.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_models import Transformer, TransformerConfig, ValueModel, value_model_from_policy
from rl_models.hf import load_hf_model, load_hf_value_model
from rl_models.lora import add_adapters, linears

V = 32
TOKENS = jnp.array([[1, 5, 9, 3, 7, 2], [4, 4, 8, 1, 0, 6]], jnp.int32)
QWEN2 = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen2"


def inputs(tokens=TOKENS):
    b, n = tokens.shape
    return tokens, jnp.broadcast_to(jnp.arange(n), (b, n)), jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool)), (b, n, n))


def tiny() -> Transformer:
    return Transformer(TransformerConfig.tiny(V, tie_embeddings=False), rngs=nnx.Rngs(0))


def pointers(tree) -> set[int]:
    return {x.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)}


def test_a_fresh_critic_predicts_zero_and_its_head_reads_the_policys_hidden_states():
    policy = tiny()
    critic = value_model_from_policy(policy)
    assert isinstance(critic, ValueModel) and critic.backbone.lm_head is None and policy.lm_head is not None
    values = critic(*inputs())
    assert values.shape == TOKENS.shape and values.dtype == jnp.float32
    assert not np.asarray(values).any()  # w = 0, b = 0
    # with a head set by hand, v_j = h_j . w + b over the policy's own hidden states
    w = jnp.linspace(-1.0, 1.0, policy.config.hidden_size)
    critic.value_head.kernel[...] = w
    critic.value_head.bias[...] = jnp.asarray(0.25)
    hidden, _ = policy(*inputs())
    np.testing.assert_allclose(critic(*inputs()), hidden @ w + 0.25, rtol=1e-5, atol=1e-5)


def test_the_critic_shares_the_policys_arrays_and_drops_the_unembedding():
    policy = tiny()
    critic = value_model_from_policy(policy)
    backbone = nnx.state(critic.backbone, nnx.Param)
    assert pointers(backbone) <= pointers(nnx.state(policy, nnx.Param))  # no copy
    assert "lm_head" not in nnx.to_pure_dict(backbone)
    head = nnx.state(critic.value_head, nnx.Param)
    assert {k: v.shape for k, v in nnx.to_pure_dict(head).items()} == {"kernel": (64,), "bias": ()}
    assert all(v.get_metadata("train_with_adapters") for v in jax.tree.leaves(head, is_leaf=lambda x: isinstance(
        x, nnx.Variable)))


def test_with_lora_the_critic_gets_fresh_adapters_of_its_own():
    policy = add_adapters(tiny(), rank=2, alpha=4.0, targets=("q_proj", "down_proj"))
    critic = value_model_from_policy(policy, seed=7)
    mine, theirs = linears(critic.backbone), linears(policy)
    assert {p for p, lin in mine.items() if lin.lora_a is not None} == {"layers/attn/q_proj", "layers/mlp/down_proj"}
    for path in ("layers/attn/q_proj", "layers/mlp/down_proj"):
        assert mine[path].lora_a.shape == theirs[path].lora_a.shape and mine[path].lora_scale == theirs[path].lora_scale
        assert not np.array_equal(mine[path].lora_a[...], theirs[path].lora_a[...])  # drawn with another seed
        assert not np.asarray(mine[path].lora_b[...]).any()  # B = 0: the adapter starts off
        assert mine[path].kernel[...] is theirs[path].kernel[...]  # the same base array
    assert not np.asarray(critic(*inputs())).any()
    # the policy's own adapters are untouched
    assert linears(policy)["layers/attn/q_proj"].lora_a is theirs["layers/attn/q_proj"].lora_a


def test_a_critic_from_a_hugging_face_folder_has_its_backbone():
    critic = load_hf_value_model(QWEN2)
    model = load_hf_model(QWEN2)
    tokens = jnp.asarray([[1, 5, 9, 3]], jnp.int32)
    hidden, _ = model(*inputs(tokens))
    w = jnp.ones((model.config.hidden_size,)) / model.config.hidden_size
    critic.value_head.kernel[...] = w
    np.testing.assert_allclose(critic(*inputs(tokens)), hidden @ w, rtol=1e-5, atol=1e-5)
