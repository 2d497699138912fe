"""The learner's log-prob pass over completions, and the behaviour-policy contract.

Every example carries `old_logp`, the log-probs of the policy that generated its
tokens, from the learner's own forward pass (`PolicyLogprobs.behaviour`) at collection
time, whenever the update can be off-policy: more than one pass over the batch, more
than one mini-batch (the policy moves between optimizer steps; the learner's
`update_is_off_policy` states these two), or rows carried over from an earlier step
(they keep the log-probs recorded when they were collected, checkpoints included; the
algorithm that carries them records them). Only on a provably on-policy step may
`old_logp` be None: the loss then uses stop_gradient(logp), which is exactly equal in
value. With async rollouts the sampler's weights are a step older than the update's:
`old_logp` is then the proximal policy's, the current weights' when the step trains
(decoupled PPO; see rl_core.pipeline).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from rl_core import multihost
from rl_core.config import RolloutConfig
from rl_core.logprobs import completion_logprobs
from rl_core.trainable import TrainableModel
from rl_core.types import TrainExample


class PolicyLogprobs:
    """(logp, entropy) [B, T] of completions under given trained parameters of the policy."""

    def __init__(self, policy: TrainableModel, rollout: RolloutConfig) -> None:
        chunk = rollout.logprob_chunk_tokens
        logprobs = functools.partial(completion_logprobs, temperature=rollout.temperature, chunk_tokens=chunk)
        self.program = policy.forward(logprobs, chunk_tokens=chunk, packs=policy.layout.packing, shares=True)

    def __call__(self, params: Any, example: TrainExample) -> tuple[jax.Array, jax.Array]:
        """Of the example's completions (0 past the trimmed width, see rl_core.trim)."""
        return self.program(params, example.prompt_tokens, example.prompt_mask, example.completion_tokens,
                            mask=example.completion_mask)

    def behaviour(self, params: Any, prompt_tokens: Any, prompt_mask: Any, completion_tokens: Any, *,
                  recorded: np.ndarray | None = None, completion_mask: Any = None) -> np.ndarray:
        """[B, T] float32 log-probs on the host; rows of `recorded` without NaN were recorded
        earlier (carried rows) and are kept as they are. With `completion_mask`, the pass runs
        at the trimmed width (0 beyond it)."""
        logp, _ = self.program(params, prompt_tokens, prompt_mask, completion_tokens, mask=completion_mask)
        fresh = np.asarray(multihost.to_host(logp), np.float32)
        if recorded is None:
            return fresh
        missing = np.isnan(recorded).any(axis=1)
        return np.where(missing[:, None], fresh, recorded).astype(np.float32)
