"""Exactly one BOS on Llama 3 chat prompts in training, evaluation and the warm start.

Llama 3's chat template writes <|begin_of_text|> itself; encoding the rendered
prompt must not add a second one.
"""

from pathlib import Path

import jax
import numpy as np
from flax import nnx

from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.rollout.sampler import GREEDY, Completions
from rl_core.testing import ToyConfig, ToyLearner
from rl_models.hf import load_hf_model, load_hf_tokenizer
from trainer import build, tasks
from trainer.evaluate import generate_texts
from trainer.warmstart import sft_arrays

LLAMA3 = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "llama3"
TOK = load_hf_tokenizer(LLAMA3)
TASK = build.chat_prompts(
    tasks.Task(
        name="sums",
        description="two sums",
        train=(Prompt("1+2=", {"answer": "3"}), Prompt("10+20=", {"answer": "30"})),
        heldout=(Prompt("3+4=", {"answer": "7"}),),
        rewards=tasks.arithmetic().rewards,
        correct="numeric_answer",
        teacher=lambda prompt, rng: prompt.fields["answer"],
        max_prompt_tokens=128,
        max_new_tokens=8,
        chat=True,
    ),
    TOK,
)


def bos_counts(tokens: np.ndarray, mask: np.ndarray) -> list[tuple[int, bool]]:
    """Per row: (BOS tokens among the real ones, the first real token is BOS)."""
    out = []
    for row, keep in zip(np.asarray(tokens), np.asarray(mask) > 0, strict=True):
        real = row[keep].tolist()
        out.append((real.count(TOK.bos_id), real[0] == TOK.bos_id))
    return out


def test_the_chat_template_writes_the_bos_and_encoding_adds_none():
    text = TASK.train[0].text
    assert text.startswith("<|begin_of_text|>")
    assert TOK.encode(text, add_bos=True).count(TOK.bos_id) == 1
    assert TOK.encode("1+2=", add_bos=True)[:1] == [TOK.bos_id]  # plain text still gets one


def test_training_prompts_have_one_bos():
    learner = ToyLearner(
        ToyConfig(group_size=2),
        policy=load_hf_model(LLAMA3),
        tokenizer=TOK,
        train_data=TASK.train,
        training=TrainingConfig(prompts_per_step=2),
        rollout=RolloutConfig(max_prompt_tokens=128),
    )
    assert bos_counts(*learner.generator.encode(TASK.train)) == [(1, True), (1, True)]


def test_warm_start_prompts_have_one_bos():
    tokens, mask, _, _ = sft_arrays(TASK, TOK, TASK.train, np.random.default_rng(0))
    assert bos_counts(tokens, mask) == [(1, True), (1, True)]


def test_evaluation_prompts_have_one_bos():
    seen = []

    def spy_sampler(params, tokens, mask, key, sampling, num_samples):
        """Records the prompts and answers EOS at once."""
        seen.append((np.asarray(tokens), np.asarray(mask)))
        n = len(tokens) * num_samples
        eos = np.full((n, 1), TOK.eos_ids[0], np.int32)
        return Completions(eos, np.zeros((n, 1), np.float32), np.ones((n, 1), np.float32),
                           np.ones(n, np.int32), np.zeros(n, bool))  # fmt: skip

    params = nnx.state(load_hf_model(LLAMA3))
    texts, _ = generate_texts(
        spy_sampler, params, TOK, TASK.heldout, max_prompt_tokens=128, sampling=GREEDY, key=jax.random.key(0)
    )
    assert texts == [""] and set(bos_counts(*seen[0])) == {(1, True)}  # the batch repeats the prompt
