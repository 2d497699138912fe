"""rl_models.value: the critic is the policy's backbone, a zero-initialised scalar head and a
head over the policy's log-probs of the tokens so far.

Model-level facts; the learner's (the critic trains, its base stays bit-identical and
shared with the policy's) are in tests/algos/test_algo_ppo.py.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import pytest
from rl_models import Transformer, TransformerConfig, ValueModel, value_model_from_policy
from rl_models.hf import load_hf_model, load_hf_value_model
from rl_models.lora import add_adapters, linears
from rl_models.value import prefix_confidence
from tolerances import close

V = 32
TOKENS = jnp.array([[1, 5, 9, 3, 7, 2], [4, 4, 8, 1, 0, 6]], jnp.int32)
QWEN2 = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen2"


def inputs(tokens=TOKENS, token_logp=None):
    b, n = tokens.shape
    logp = jnp.zeros(tokens.shape, jnp.float32) if token_logp is None else token_logp
    return (tokens, jnp.broadcast_to(jnp.arange(n), (b, n)), jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool)), (b, n, n)),
            logp)


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
    hidden, _ = policy(*inputs()[:3])
    np.testing.assert_allclose(critic(*inputs()), hidden @ w + 0.25, **close(rtol=1e-5, atol=1e-5))


def test_the_critic_shares_the_policys_arrays_and_drops_the_unembedding():
    policy = tiny()
    critic = value_model_from_policy(policy)
    backbone = nnx.state(critic.backbone, nnx.Param)
    assert pointers(backbone) <= pointers(nnx.state(policy, nnx.Param))  # no copy
    assert "lm_head" not in nnx.to_pure_dict(backbone)
    head = nnx.state(critic.value_head, nnx.Param)
    assert {k: v.shape for k, v in nnx.to_pure_dict(head).items()} == {"kernel": (64,), "bias": ()}
    confidence = nnx.state(critic.confidence_head, nnx.Param)
    assert {k: v.shape for k, v in nnx.to_pure_dict(confidence).items()} == {"kernel": (3, 64), "bias": (64,),
                                                                             "out": (64,)}
    for heads in (head, confidence):  # trained beside adapters, never frozen with the base
        assert all(v.get_metadata("train_with_adapters") for v in jax.tree.leaves(
            heads, is_leaf=lambda x: isinstance(x, nnx.Variable)))


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
    hidden, _ = model(*inputs(tokens)[:3])
    w = jnp.ones((model.config.hidden_size,)) / model.config.hidden_size
    critic.value_head.kernel[...] = w
    np.testing.assert_allclose(critic(*inputs(tokens)), hidden @ w, **close(rtol=1e-5, atol=1e-5))


def test_prefix_confidence_by_hand():
    # the prompt (0: certain), three sampled tokens, an environment's token (0), one more sampled
    logp = jnp.log(jnp.asarray([[1.0, 1.0, 0.5, 0.5, 1.0, 0.8]]))
    features = np.asarray(prefix_confidence(logp))[0]
    np.testing.assert_allclose(features[:, 0], [1, 1, 0.5, 0.25, 0.25, 0.2],
        **close(rtol=1e-6))  # the prefix's probability
    np.testing.assert_allclose(features[:, 1], [1, 1, 0.5, 0.5, 0.5, 0.5], **close(rtol=1e-6))  # its least likely token
    np.testing.assert_allclose(features[:, 2], [1, 1, 0.5, 0.5, 1.0, 0.8], **close(rtol=1e-6))  # the last token


def test_the_confidence_head_reads_the_log_probs_of_tokens_up_to_each_position_only():
    policy = tiny()
    critic = value_model_from_policy(policy)
    logp = jnp.log(jnp.asarray([[1.0, 1.0, 0.9, 0.3, 0.7, 0.6], [1.0, 1.0, 1.0, 0.2, 0.95, 0.5]]))
    assert not np.asarray(critic(*inputs(TOKENS, logp))).any()  # u = 0 at the start
    head = critic.confidence_head
    head.out[...] = jnp.linspace(-1.0, 1.0, head.out.shape[0])
    values = np.asarray(critic(*inputs(TOKENS, logp)))
    features = prefix_confidence(logp)
    np.testing.assert_allclose(values, jax.nn.gelu(features @ head.kernel[...] + head.bias[...]) @ head.out[...],
                               **close(rtol=1e-5, atol=1e-6))  # the scalar head is still 0
    later = logp.at[:, 4:].set(jnp.log(0.01))  # other log-probs from position 4 on
    np.testing.assert_array_equal(np.asarray(critic(*inputs(TOKENS, later)))[:, :4], values[:, :4])
    assert not np.allclose(np.asarray(critic(*inputs(TOKENS, later)))[:, 4:], values[:, 4:],
        **close(rtol=1e-5, atol=1e-8))


def test_a_critic_without_the_confidence_head_ignores_log_probs_and_one_with_it_needs_them():
    plain = value_model_from_policy(tiny(), confidence=False)
    assert plain.confidence_head is None
    plain.value_head.bias[...] = jnp.asarray(0.5)
    np.testing.assert_array_equal(plain(*inputs()[:3]), plain(*inputs(TOKENS, jnp.full(TOKENS.shape, -3.0))))
    with pytest.raises(ValueError, match="token_logp must be the behaviour log-prob of each token"):
        value_model_from_policy(tiny())(*inputs()[:3])
