"""The `static` rollout backend: today's one-program sampler behind the protocol.

It samples from the parameters it is given as they are (the learner's master
weights in their training layout: no copy, no transfer), with one key for the
whole call, so a completion depends on the batch it was drawn in. Use it for
tests and short completions; `paged` is the backend for real lengths.
"""

from __future__ import annotations

from typing import Any

import jax

from rl_core.rollout.backend import Capabilities, Requests, StatelessBackend, with_version
from rl_core.rollout.sampler import Completions, Sampler, SamplingParams


class StaticBackend(StatelessBackend):
    """`RolloutBackend` over a `rl_core.rollout.sampler.Sampler`."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.version = -1
        self._params: Any = None

    capabilities = Capabilities(keeps_reference=True, routing=True)
    """It decodes every row to max_new_tokens (or until every row ended), ignoring `Requests.max_new_tokens`
    and `stop_strings`, with a program per row count (callers pad rows to a few counts); it samples from
    the very arrays `update_weights` was given (a pinned caller copies them); it holds nothing between calls."""

    @property
    def compiles(self) -> int:
        return self.sampler.compiles

    def update_weights(self, params: Any, version: int) -> None:
        # a reference, not a copy: valid until the caller's next update donates it,
        # and the learner refreshes before every rollout after an update
        self._params = params
        self.version = version

    def generate(self, requests: Requests, sampling: SamplingParams, key: jax.Array) -> Completions:
        if self._params is None:
            raise RuntimeError("StaticBackend.generate before update_weights: no weights to sample with")
        out = self.sampler(
            self._params, requests.prompt_tokens, requests.prompt_mask, key, sampling, requests.num_samples
        )
        return with_version(out, self.version)

