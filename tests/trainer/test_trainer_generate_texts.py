"""generate_texts: num_samples completions per prompt, prompt-major, across fixed-shape batches."""

import jax
import numpy as np
from flax import nnx
from rl_core.data import Prompt
from rl_core.rollout.sampler import GREEDY, Sampler
from rl_models import CharTokenizer, Transformer, TransformerConfig
from trainer.evaluate import generate_texts

TOKENIZER = CharTokenizer()


def test_samples_come_prompt_major_across_padded_batches():
    model = Transformer(TransformerConfig.tiny(TOKENIZER.vocab_size), rngs=nnx.Rngs(3))
    graphdef, state = nnx.split(model)
    sampler = Sampler(graphdef, max_new_tokens=6, eos_ids=TOKENIZER.eos_ids, pad_id=TOKENIZER.pad_id)
    prompts = [Prompt(text) for text in ("12+34=", "7+8=", "99+1=", "5+55=", "40+2=")]
    common = dict(max_prompt_tokens=16, sampling=GREEDY, key=jax.random.PRNGKey(0))
    texts, lengths = generate_texts(sampler, state, TOKENIZER, prompts, batch_size=4, **common)
    assert len(texts) == 5 and len(set(texts)) > 1  # the prompts lead to different completions
    # 3 samples per prompt, 2 prompts per call: three calls, the last one padded with a repeat
    shared, shared_lengths = generate_texts(sampler, state, TOKENIZER, prompts, batch_size=6, num_samples=3, **common)
    assert shared == [t for t in texts for _ in range(3)]
    np.testing.assert_array_equal(shared_lengths, np.repeat(lengths, 3))
