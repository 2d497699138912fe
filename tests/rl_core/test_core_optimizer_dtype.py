"""bfloat16 parameters with float32 optimizer state, or state in the parameters' dtype."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.testing import ToyConfig, ToyLearner, digit_prompts
from rl_models import CharTokenizer, Transformer, TransformerConfig


@pytest.mark.parametrize(("state_dtype", "expected"), [("float32", jnp.float32), ("param", jnp.bfloat16)])
def test_bfloat16_params_keep_their_dtype_and_the_optimizer_state_follows_the_setting(state_dtype, expected):
    tokenizer = CharTokenizer()
    config = TransformerConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
        mlp_hidden_size=64, dtype="bfloat16",
    )
    learner = ToyLearner(
        ToyConfig(group_size=2, target_token=tokenizer.encode("5")[0]),
        policy=Transformer(config, rngs=nnx.Rngs(0)),
        tokenizer=tokenizer,
        train_data=digit_prompts(8),
        training=TrainingConfig(
            prompts_per_step=2, learning_rate=1e-2, optimizer="adam", optimizer_state_dtype=state_dtype
        ),
        rollout=RolloutConfig(max_prompt_tokens=8, max_new_tokens=4),
    )
    batch = learner.produce_examples(learner.data.next(2)).example
    # fixed, non-zero advantages so that the step has a gradient to apply
    batch = batch._replace(advantages=jnp.asarray([1.0, -1.0, 1.0, -1.0]))
    before = jax.tree.map(jnp.copy, learner.params)
    for mini in learner._mini_batches(batch):
        learner.params, learner.opt_state, _ = learner._update(learner.params, learner.opt_state, mini)
    assert {x.dtype for x in jax.tree.leaves(learner.params)} == {jnp.dtype(jnp.bfloat16)}
    adam_moments = [x for x in jax.tree.leaves(learner.opt_state) if x.ndim > 0]
    assert adam_moments and {x.dtype for x in adam_moments} == {jnp.dtype(expected)}
    changed = [bool(jnp.any(a != b)) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(learner.params))]
    assert any(changed)
