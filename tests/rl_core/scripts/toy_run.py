"""Small ToyLearner runs shared by in-process tests and the subprocess scripts beside this file.

The tests load this file by path; the scripts import it from their own folder.
Everything here is deterministic: the same call builds the same learner in
any process.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.testing import ToyConfig, ToyLearner, digit_prompts
from rl_models import PAGED_TRANSFORMER, CharTokenizer, Transformer, TransformerConfig

TOKENIZER = CharTokenizer()
ROLLOUT = RolloutConfig(max_prompt_tokens=16, max_new_tokens=8, temperature=1.0, seed=0)
DATA = digit_prompts(32, seed=0)

TARGET_TOKEN = 16
"""A token the initial tiny policy (seed 0) samples often at temperature 1, so that
rewards differ within groups and gradients are not zero. Tests assert that the
parameters really moved; if the model's initialization changes, pick another."""


def policy(seed: int = 0) -> Transformer:
    return Transformer(TransformerConfig.tiny(TOKENIZER.vocab_size), rngs=nnx.Rngs(seed))


def make_learner(
    *,
    training: TrainingConfig,
    toy: ToyConfig | None = None,
    rollout: RolloutConfig = ROLLOUT,
    mesh: Mesh | None = None,
    data=DATA,
    output_dir: str | None = None,
) -> ToyLearner:
    return ToyLearner(
        toy or ToyConfig(group_size=4, target_token=TARGET_TOKEN),
        policy=policy(),
        paging=PAGED_TRANSFORMER,
        tokenizer=TOKENIZER,
        train_data=data,
        training=training,
        rollout=rollout,
        mesh=mesh,
        output_dir=output_dir,
    )


# Adam state, a warm-up + cosine schedule and micro-batches all have to survive the restart.
RESUME_TRAINING = TrainingConfig(
    optimizer="adamw",
    learning_rate=1e-2,
    lr_schedule="cosine",
    warmup_steps=1,
    weight_decay=0.01,
    prompts_per_step=2,
    micro_batch_size=4,
    num_steps=4,
    checkpoint_every_steps=2,
)


RESUME_TOY = ToyConfig(group_size=4, target_token=TARGET_TOKEN, loss_agg_mode="seq-mean-token-mean")

DATA_PARALLEL_TRAINING = TrainingConfig(
    optimizer="sgd",
    learning_rate=0.5,
    max_grad_norm=1.0,
    prompts_per_step=4,  # 4 prompts x 4 completions = 16 rows
    mini_batch_size=8,  # two optimizer updates per step
    micro_batch_size=4,  # each of two accumulated micro-batches of 4 rows, one row per device
    num_steps=2,
)


def params_numpy(learner: ToyLearner) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(learner.params))]


def max_abs_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))
