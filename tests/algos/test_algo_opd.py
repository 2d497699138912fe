"""algo-opd and distillation in the learner: the teacher checked against the student (vocabulary,
given exactly when distill_coef > 0), its log-probs in the example equal to a direct pass over the
teacher, micro-batched as the reference's, and the opd config's changes from GRPO."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rewards
import rl_models
from rl_core import registry
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.policy.logprobs import completion_logprobs
from rl_core.train.frozen_model import teacher_model
from rl_core.train.layout import BatchLayout
from rl_core.runtime.mesh import training_mesh
from tolerances import close

TOK = rl_models.CharTokenizer()
MODEL = rl_models.TransformerConfig.tiny(
    TOK.vocab_size, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, mlp_hidden_size=64
)
G = 4
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 10) for b in range(1, 10)]


def abstract(config):
    return nnx.eval_shape(lambda: rl_models.Transformer(config, rngs=nnx.Rngs(0)))


def test_opd_is_grpo_with_its_four_changes():
    from algo_grpo import GRPOConfig, GRPOLearner

    algorithm = registry.get_algorithm("opd")
    config = algorithm.config()
    assert algorithm.learner is GRPOLearner and isinstance(config, GRPOConfig)
    changed = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
               if getattr(config, f.name) != getattr(GRPOConfig(), f.name)}
    assert changed == {"advantage_estimator": "zero", "distill_coef": 1.0, "beta": 0.0, "loss_agg_mode": "token-mean"}


def test_the_teacher_is_checked_against_the_student():
    layout = BatchLayout(TrainingConfig(prompts_per_step=2), 8, training_mesh(TrainingConfig()), G)
    student = abstract(MODEL)
    smaller = abstract(dataclasses.replace(MODEL, vocab_size=MODEL.vocab_size - 5))
    with pytest.raises(ValueError, match=r"the teacher's vocabulary has 94 tokens and the student's 99: .* "
                                         r"needs at least the student's vocabulary"):
        teacher_model(smaller, student, distill_coef=1.0, layout=layout)
    # more rows than the student's (embeddings padded otherwise, as Qwen2.5's 1.5B and 7B): it scores every id
    larger = rl_models.Transformer(dataclasses.replace(MODEL, vocab_size=MODEL.vocab_size + 5), rngs=nnx.Rngs(1))
    assert teacher_model(larger, student, distill_coef=1.0, layout=layout).params["embed"].shape == (104, 32)
    with pytest.raises(ValueError, match="distill_coef = 1.0 needs a teacher model: pass teacher="):
        teacher_model(None, student, distill_coef=1.0, layout=layout)
    with pytest.raises(ValueError, match="a teacher was given but distill_coef = 0"):
        teacher_model(student, student, distill_coef=0.0, layout=layout)
    assert teacher_model(None, student, distill_coef=0.0, layout=layout) is None


@pytest.mark.e2e  # builds a learner and compiles its passes
@pytest.mark.parametrize("name", ["opd", "grpo"])
def test_the_examples_carry_the_teachers_logprobs(name):
    """GRPO + distill_coef and opd: the teacher's pass (two micro-batches, shared prompts, chunks of 2
    tokens) gives what one plain pass over the teacher gives, the step logs the reverse KL to it, and
    an update trimmed to its completions' width trims the teacher's log-probs with the rest."""
    algorithm = registry.get_algorithm(name)
    config = dataclasses.replace(algorithm.config(), group_size=G, distill_coef=0.5, teacher="tiny, seed 1")
    teacher = rl_models.Transformer(MODEL, rngs=nnx.Rngs(1))
    learner = algorithm.learner(
        config, policy=rl_models.Transformer(MODEL, rngs=nnx.Rngs(0)), teacher=teacher, tokenizer=TOK,
        train_data=PROMPTS, training=TrainingConfig(prompts_per_step=2, num_steps=1, micro_batch_size=4),
        rollout=RolloutConfig(max_new_tokens=4, max_prompt_tokens=8, logprob_chunk_tokens=2),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward()]),
    )
    batch = learner.produce_examples(PROMPTS[:2])
    ex = batch.example
    direct, _ = completion_logprobs(teacher, jnp.asarray(ex.prompt_tokens), jnp.asarray(ex.prompt_mask),
                                    jnp.asarray(ex.completion_tokens))
    mask = np.asarray(ex.completion_mask) > 0
    np.testing.assert_allclose(np.asarray(ex.teacher_logp)[mask], np.asarray(direct)[mask], **close(atol=1e-5))
    stats = learner.update_models(ex)["policy"][0]
    total, count = stats["means"]["train/distill_reverse_kl"]
    assert np.isfinite(total / count) and abs(total / count) > 1e-3  # two random models disagree
    # completions of at most 2 tokens: the update trims every [B, T] field to 2 columns, the teacher's too
    short = ex._replace(completion_mask=np.asarray(ex.completion_mask) * (np.arange(4) < 2))
    stats = learner.update_models(short)["policy"][0]
    assert bool(stats["finite"]) and np.isfinite(stats["loss"])
