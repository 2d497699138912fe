"""The protocol every rollout backend follows, and what flows through it.

A backend turns requests (prompts, each sampled `num_samples` times) into
completions with the weights it was last given. It owns its inference
weights: `update_weights(params, version)` hands it the learner's master
parameters once per step, and every completion it returns records the
version that produced it (what asynchronous rollouts and importance weights
key on).

Backends: `static` (rl_core.rollout.static: the one-program sampler, for tests
and tiny runs) and `paged` (rl_core.rollout.paged: paged KV cache and
continuous batching, for real lengths).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import numpy as np

from rl_core.rollout.sampler import Completions, SamplingParams


class Requests(NamedTuple):
    """U prompts, each to be sampled `num_samples` (G) times.

    Row i * G + j of the completions is sample j of prompt i. `prompt_ids`
    name the prompts for their random keys (backends that key each completion by
    (prompt id, sample index), like `paged`, give a prompt the same completions
    whichever other requests share the call).
    """

    prompt_tokens: np.ndarray  # [U, P] int32, left-padded
    prompt_mask: np.ndarray  # [U, P], 1 = real token
    num_samples: int = 1
    prompt_ids: np.ndarray | None = None  # [U] int; None = 0..U-1

    def ids(self) -> np.ndarray:
        u = len(self.prompt_tokens)
        ids = np.arange(u) if self.prompt_ids is None else np.asarray(self.prompt_ids)
        if ids.shape != (u,):
            raise ValueError(f"prompt_ids has shape {ids.shape}; expected ({u},), one id per prompt")
        return ids.astype(np.int64)


@runtime_checkable
class RolloutBackend(Protocol):
    """Generates completions with the weights of the last `update_weights`."""

    version: int
    """The weight version the next completions are generated with (-1 before any update)."""

    def update_weights(self, params: Any, version: int) -> None:
        """Take the policy's parameters (the whole tree `nnx.merge` takes; master weights
        in their training layout) as weight version `version`; called once per step."""
        ...

    def generate(self, requests: Requests, sampling: SamplingParams, key: jax.Array) -> Completions:
        """Completions [U * G, T] with `version` filled in (one entry per row)."""
        ...


def with_version(out: Completions, version: int) -> Completions:
    """`out` with every row stamped with weight `version`."""
    return out._replace(version=np.full(out.lengths.shape[0], version, np.int32))
