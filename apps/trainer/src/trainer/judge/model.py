"""The judge model on the project's own rollout engine: greedy replies, or yes/no log-probs.

`replies` sends every judge prompt of a step through one call of the configured backend
(rl_core.rollout.factory.make_backend, greedy); the weights go to the backend once, as weight
version 0, and never change. `yes_logprobs` runs one forward pass over the prompts and reads
the log-probs of the yes and no tokens at the first position the judge would generate:
the distribution greedy decoding takes its first token from (G-Eval's probability-weighted
score, arXiv:2303.16634).
"""

from __future__ import annotations

import threading

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from rl_core import decode_completions, encode_prompts, GREEDY, PagedModel, RolloutConfig, Tokenizer
from rl_core.policy import sequence_inputs
from rl_core.rollout import make_backend, Requests
from rl_core.runtime import multihost


class JudgeModel:
    """A frozen model and its tokenizer, generating greedily through a rollout backend."""

    def __init__(self, module: nnx.Module, tokenizer: Tokenizer, *, max_prompt_tokens: int, max_new_tokens: int,
                 engine: str = "auto", paging: PagedModel | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.graphdef, self.params = nnx.split(module)
        self.vocab_size = int(module.vocab_size)
        rollout = RolloutConfig(max_prompt_tokens=max_prompt_tokens, max_new_tokens=max_new_tokens,
                                temperature=0.0, engine=engine)
        self.backend = make_backend(rollout, self.graphdef, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id,
                                    paging=paging, policy=module)
        self.backend.update_weights(self.params, 0)
        self._key = jax.random.key(0)  # greedy: drawn from no distribution, any key gives the same replies
        # one engine, one caller at a time: overlapping scorings (training.max_staleness >= 2) call the
        # judge from several threads, and a paged engine's scheduler and pages serve one rollout at a time
        self._engine_lock = threading.Lock()
        self._first_logprobs = first_logprobs_program(self.graphdef)

    def fits(self, prompts: Sequence[str]) -> list[bool]:
        """Whether each judge prompt fits judge.max_prompt_tokens (BOS included)."""
        return [len(self.tokenizer.encode(p, add_bos=True)) <= self.max_prompt_tokens for p in prompts]

    def encode(self, prompts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Left-padded judge prompt tokens; a prompt over max_prompt_tokens is a ValueError naming it."""
        for prompt, ok in zip(prompts, self.fits(prompts), strict=True):
            if not ok:
                raise ValueError(
                    f"a judge prompt is longer than judge.max_prompt_tokens = {self.max_prompt_tokens} tokens "
                    f"(it begins {prompt[:80]!r})"
                )
        return encode_prompts(self.tokenizer, prompts, max_tokens=self.max_prompt_tokens)

    def replies(self, prompts: Sequence[str]) -> list[str]:
        """The judge's greedy reply to each prompt, all in one backend call."""
        tokens, mask = self.encode(prompts)
        with self._engine_lock:
            out = multihost.to_host(self.backend.generate(Requests(tokens, mask, 1), GREEDY, self._key))
        return decode_completions(self.tokenizer, np.asarray(out.tokens), np.asarray(out.mask))

    def first_token(self, word: str) -> int:
        """The token the judge generates first when it replies `word`."""
        ids = self.tokenizer.encode(word)
        if not ids:
            raise ValueError(f"the judge's tokenizer encodes {word!r} as no token")
        return ids[0]

    def yes_logprobs(self, prompts: Sequence[str], yes_word: str, no_word: str) -> np.ndarray:
        """[N, 2] log-probs of the first tokens of `yes_word` and `no_word` as the judge's first reply token."""
        ids = np.asarray([self.first_token(yes_word), self.first_token(no_word)], np.int32)
        if ids[0] == ids[1]:
            raise ValueError(f"the judge's tokenizer starts {yes_word!r} and {no_word!r} with the same token "
                             f"({int(ids[0])}); choose judge.yes_word and judge.no_word that differ in their first token")
        return self.first_logprobs(prompts, ids)

    def first_logprobs(self, prompts: Sequence[str], ids: np.ndarray | None = None) -> np.ndarray:
        """[N, len(ids)] log-probs of tokens `ids` (default: the whole vocabulary) as the first reply token."""
        tokens, mask = self.encode(prompts)
        ids = np.arange(self.vocab_size, dtype=np.int32) if ids is None else np.asarray(ids, np.int32)
        return np.asarray(self._first_logprobs(self.params, tokens, mask, ids))  # only [N, len(ids)] leaves the device

    def model(self) -> nnx.Module:
        """The judge as an NNX module (its weights, not the engine's inference copy)."""
        return nnx.merge(self.graphdef, self.params)


def first_logprobs_program(graphdef: nnx.GraphDef) -> Callable[..., jax.Array]:
    """The judge's yes/no program, jitted: (params, prompt tokens [N, P], mask [N, P], token ids [K])
    -> [N, K], the log-softmax after each whole prompt at `ids` (`trainer plan` compiles this same program)."""

    def first_logprobs(params: Any, tokens: jax.Array, mask: jax.Array, ids: jax.Array) -> jax.Array:
        model = nnx.merge(graphdef, params)
        positions, attention = sequence_inputs(mask, 0)
        hidden, _ = model(tokens, positions, attention, outputs_from=tokens.shape[1] - 1)
        return jax.nn.log_softmax(model.logits(hidden[:, -1]).astype(jnp.float32), axis=-1)[:, ids]

    return jax.jit(first_logprobs)
