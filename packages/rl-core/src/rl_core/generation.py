"""The learner's rollout part: the policy's prompts in, sampled completions out.

It holds the one-program sampler (the trainer's evaluation samples with it too) and
the rollout backend `rollout.engine` asks for (rl_core.rollout), and hands the
backend the policy's weights on the first rollout after they change, stamped with
the learner's step as their version.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from rl_core.config import RolloutConfig
from rl_core.data import Prompt
from rl_core.rollout.backend import Requests
from rl_core.rollout.factory import make_backend
from rl_core.sampler import Completions, Sampler, SamplingParams
from rl_core.tokens import Tokenizer, decode_completions, encode_prompts
from rl_core.trainable import TrainableModel


class PolicyRollouts:
    """Sampling from a policy part (rl_core.trainable) through the configured backend."""

    def __init__(self, rollout: RolloutConfig, tokenizer: Tokenizer, policy: TrainableModel, *, batch_size: int,
                 module: nnx.Module) -> None:
        self.rollout, self.tokenizer, self.policy = rollout, tokenizer, policy
        mesh = policy.layout.mesh
        self.sampler = Sampler(
            policy.graphdef, max_new_tokens=rollout.max_new_tokens, eos_ids=tokenizer.eos_ids,
            pad_id=tokenizer.pad_id, mesh=mesh, param_shardings=policy.shardings,
        )
        self.backend = make_backend(
            rollout, policy.graphdef, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id, mesh=mesh,
            param_shardings=policy.shardings, batch_size=batch_size, sampler=self.sampler, policy=module,
        )
        self._weights_of: Any = None  # the trained parameters the backend holds

    def encode(self, prompts: Sequence[Prompt]) -> tuple[np.ndarray, np.ndarray]:
        """Left-padded prompt tokens and mask [len(prompts), P]."""
        return encode_prompts(self.tokenizer, [p.text for p in prompts], max_tokens=self.rollout.max_prompt_tokens)

    def generate(self, prompt_tokens: np.ndarray, prompt_mask: np.ndarray, sampling: SamplingParams | None, *,
                 num_samples: int, key: jax.Array, version: int) -> Completions:
        """`num_samples` completions per prompt row with the policy's current parameters (row
        i * num_samples + j is sample j of prompt i); new weights go to the backend as `version`."""
        if self._weights_of is not self.policy.params:  # new parameters since the last rollout
            self.backend.update_weights(self.policy.whole_params(), version)
            self._weights_of = self.policy.params
        sampling = sampling or SamplingParams.from_rollout(self.rollout)
        return self.backend.generate(Requests(prompt_tokens, prompt_mask, num_samples), sampling, key)

    def decode(self, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
        """Completion texts (tokens under the mask, EOS dropped)."""
        return decode_completions(self.tokenizer, tokens, mask)
