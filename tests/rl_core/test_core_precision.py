"""Float32 master weights: bfloat16 compute trains at a real learning rate.

AdamW at lr 1e-6 moves each parameter by about 1e-6 per step. On bfloat16
parameters (8 bits of mantissa) such a step rounds away for almost every
weight; float32 masters keep it, whatever dtype the policy computes in.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.testing import ToyConfig, ToyLearner, digit_prompts
from rl_models import CharTokenizer, Transformer, TransformerConfig

TOK = CharTokenizer()


def make(dtype: str, param_dtype: str = "float32") -> tuple[ToyLearner, Transformer]:
    config = TransformerConfig(
        vocab_size=TOK.vocab_size, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
        mlp_hidden_size=64, tie_embeddings=True, dtype=dtype, param_dtype=param_dtype,
    )  # fmt: skip
    policy = Transformer(config, rngs=nnx.Rngs(0))
    learner = ToyLearner(
        ToyConfig(group_size=4, target_token=TOK.encode("5")[0]),
        policy=policy,
        tokenizer=TOK,
        train_data=digit_prompts(8),
        training=TrainingConfig(prompts_per_step=4, learning_rate=1e-6, optimizer="adamw"),
        rollout=RolloutConfig(max_prompt_tokens=8, max_new_tokens=4),
    )
    return learner, policy


@functools.cache
def three_steps(dtype: str, param_dtype: str = "float32") -> tuple[np.ndarray, ToyLearner, Transformer, object]:
    """(flat parameter change, learner, policy, batch) of 3 AdamW steps at lr 1e-6 on one batch."""
    learner, policy = make(dtype, param_dtype)
    batch = learner.produce_examples(learner.supply().stream.next(4)).example
    batch = batch._replace(advantages=jnp.asarray(np.tile([1.0, -1.0], 8), jnp.float32))
    if dtype != "float32":  # the same completions as the float32 run, so the updates compare
        batch = three_steps("float32")[3]
    before = jax.tree.map(np.array, learner.params)
    for _ in range(3):
        (stats,) = learner.update_models(batch)["policy"]
        assert stats["finite"] and not stats["empty"]
    deltas = jax.tree.map(lambda a, b: np.asarray(a) - b, learner.params, before)
    return np.concatenate([d.ravel() for d in jax.tree.leaves(deltas)]), learner, policy, batch


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_master_weights_and_optimizer_state_are_float32(param_dtype):
    _, learner, policy, _ = three_steps("bfloat16", param_dtype)
    assert {x.dtype for x in jax.tree.leaves(learner.params)} == {jnp.dtype(jnp.float32)}
    moments = [x for x in jax.tree.leaves(learner.state.policy.opt_state) if x.ndim > 0]
    assert moments and {x.dtype for x in moments} == {jnp.dtype(jnp.float32)}
    # the caller's module keeps its storage dtype and its values (the learner trains a copy)
    assert {x.dtype for x in jax.tree.leaves(nnx.state(policy))} == {jnp.dtype(param_dtype)}


def test_bfloat16_compute_at_lr_1e6_changes_almost_every_parameter():
    f32, *_ = three_steps("float32")
    bf16, *_ = three_steps("bfloat16")
    changed = float(np.mean(bf16 != 0))
    print(f"changed after 3 AdamW steps at lr 1e-6: float32 {np.mean(f32 != 0):.4f}, bfloat16 compute {changed:.4f}")
    assert changed >= 0.95
    # About 3e-6 per weight (3 steps of ~lr each), as in float32.
    assert 1e-6 < float(np.median(np.abs(bf16))) < 4e-6


def test_bfloat16_compute_update_matches_float32_to_bfloat16_tolerance():
    f32, *_ = three_steps("float32")
    bf16, *_ = three_steps("bfloat16")
    # Adam normalises each weight's step, so bfloat16 rounding of the gradients shows as a few
    # sign flips on weights whose gradient is near zero; the update as a whole is the same.
    cosine = float(f32 @ bf16 / (np.linalg.norm(f32) * np.linalg.norm(bf16)))
    agree = float(np.mean(np.sign(f32) == np.sign(bf16)))
    print(f"bfloat16 vs float32 update: cosine {cosine:.4f}, sign agreement {agree:.4f}")
    assert cosine > 0.98 and agree > 0.98
