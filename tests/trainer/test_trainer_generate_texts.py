"""generate_texts: num_samples completions per prompt, prompt-major, in calls sized to their
completions (a power of two of prompts, at most a batch); the scheduled evaluation's time."""

from types import SimpleNamespace

import jax
import numpy as np
import pytest
from flax import nnx
from rl_core.data import Prompt
from rl_core.rollout.sampler import GREEDY, Completions, Sampler, SamplingParams
from rl_models import CharTokenizer, Transformer, TransformerConfig
from trainer import build
from trainer.evaluate import generate_texts
from trainer.evaluate.heldout import call_rows
from trainer.settings import build_settings

TOKENIZER = CharTokenizer()


def test_samples_come_prompt_major_across_padded_batches():
    model = Transformer(TransformerConfig.tiny(TOKENIZER.vocab_size), rngs=nnx.Rngs(3))
    graphdef, state = nnx.split(model)
    sampler = Sampler(graphdef, max_new_tokens=6, eos_ids=TOKENIZER.eos_ids, pad_id=TOKENIZER.pad_id)
    prompts = [Prompt(text) for text in ("12+34=", "7+8=", "99+1=", "5+55=", "40+2=")]
    common = dict(max_prompt_tokens=16, sampling=GREEDY, key=jax.random.PRNGKey(0))
    texts, lengths = generate_texts(sampler, state, TOKENIZER, prompts, batch_size=4, **common)
    assert len(texts) == 5 and len(set(texts)) > 1  # the prompts lead to different completions
    # 3 samples per prompt, 2 prompts per call: three calls, the last one of one prompt
    shared, shared_lengths = generate_texts(sampler, state, TOKENIZER, prompts, batch_size=6, num_samples=3, **common)
    assert shared == [t for t in texts for _ in range(3)]
    np.testing.assert_array_equal(shared_lengths, np.repeat(lengths, 3))


class Recording:
    """A sampler that records the rows each call decodes (prompt rows x samples) and answers
    every row with EOS at once: what `generate_texts` asks of the engine, without a model."""

    def __init__(self):
        self.rows = []

    def __call__(self, params, tokens, mask, key, sampling, num_samples=1):
        n = len(tokens) * num_samples
        self.rows.append(n)
        eos = np.full((n, 2), TOKENIZER.eos_ids[0], np.int32)
        return Completions(eos, np.zeros((n, 2), np.float32), np.ones((n, 2), np.float32), np.ones(n, np.int32),
                           np.zeros(n, bool))


@pytest.mark.parametrize(("prompts", "num_samples", "rows"), [
    (4, 1, [4]), (32, 1, [32]), (33, 1, [64]), (300, 1, [256, 64]),  # 300: a full batch, then 44 rounded up
    (4, 8, [32]), (33, 8, [256, 8]), (5, 3, [24]),  # 5 x 3: 8 prompts of 85 per call, not 85
])
def test_each_call_decodes_its_completions_rounded_up_to_a_power_of_two(prompts, num_samples, rows):
    sampler = Recording()
    texts, lengths = generate_texts(sampler, None, TOKENIZER, [Prompt(f"{i}+1=") for i in range(prompts)],
                                    max_prompt_tokens=8, sampling=GREEDY, key=jax.random.PRNGKey(0),
                                    num_samples=num_samples)  # the default batch of 256 completions
    assert sampler.rows == rows
    assert len(texts) == len(lengths) == prompts * num_samples  # the real ones only


def test_call_rows():
    assert [call_rows(n, 256) for n in (1, 2, 3, 4, 5, 32, 33, 200, 256)] == [1, 2, 4, 4, 8, 32, 64, 256, 256]
    assert {call_rows(n, 85) for n in range(1, 86)} == {1, 2, 4, 8, 16, 32, 64, 85}  # few programs compile
    with pytest.raises(ValueError, match="prompts = 0 must be in"):
        call_rows(0, 4)


class PaddedToTheBatch:
    """The evaluation before it was sized to its work: every call padded with repeats of its last
    prompt to `per_call` prompts, whatever it holds."""

    def __init__(self, sampler, per_call):
        self.sampler, self.per_call = sampler, per_call

    def __call__(self, params, tokens, mask, key, sampling, num_samples=1):
        real, pad = len(tokens), self.per_call - len(tokens)
        tokens, mask = (np.concatenate([x, np.repeat(x[-1:], pad, axis=0)]) for x in (tokens, mask))
        out = self.sampler(params, tokens, mask, key, sampling, num_samples)
        return Completions(*(x[: real * num_samples] for x in out[:5]))


@pytest.mark.parametrize(("sampling", "num_samples"), [(GREEDY, 1), (SamplingParams(temperature=1.0), 3)])
def test_sized_calls_answer_as_the_padded_ones(sampling, num_samples):
    model = Transformer(TransformerConfig.tiny(TOKENIZER.vocab_size), rngs=nnx.Rngs(3))
    graphdef, state = nnx.split(model)
    sampler = Sampler(graphdef, max_new_tokens=6, eos_ids=TOKENIZER.eos_ids, pad_id=TOKENIZER.pad_id)
    prompts = [Prompt(text) for text in ("12+34=", "7+8=", "99+1=", "5+55=", "40+2=", "3+3=")]
    common = dict(max_prompt_tokens=16, sampling=sampling, key=jax.random.PRNGKey(0), num_samples=num_samples)
    batch = 16 * num_samples  # 16 prompts a call: one call of 8 prompts, not of 16
    sized = generate_texts(sampler, state, TOKENIZER, prompts, batch_size=batch, **common)
    padded = generate_texts(PaddedToTheBatch(sampler, 16), state, TOKENIZER, prompts, batch_size=batch, **common)
    assert len(set(sized[0])) > 1  # the prompts lead to different completions
    assert sized[0] == padded[0]
    np.testing.assert_array_equal(sized[1], padded[1])


def test_scheduled_evaluation_reports_its_time():
    settings = build_settings(overrides=["eval.heldout_size=4", "model.preset=tiny"])
    task = settings.task.build()
    model = Transformer(TransformerConfig.tiny(TOKENIZER.vocab_size), rngs=nnx.Rngs(3))
    graphdef, state = nnx.split(model)
    sampler = Recording()
    learner = SimpleNamespace(generator=SimpleNamespace(sampler=sampler), policy_params=lambda: state, tokenizer=TOKENIZER,
                              heldout_metrics=lambda prompts: {"eval/extra": 1.0})
    metrics = build.eval_fn(task, settings)(learner)
    assert sampler.rows == [4]  # eval.heldout_size=4 decodes 4 rows, not a batch of 256
    assert {"eval/accuracy", "eval/extra"} <= metrics.keys()
    assert metrics["time/eval"] > 0.0
