"""The learner's rollout step: prompts to completions, single-turn or as episodes."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from rl_core.config import RolloutConfig
from rl_core.data import Prompt
from rl_core.episodes.agents import agent_runtime
from rl_core.episodes.runner import EpisodeLimits, Rollout, Sessions, run_episodes, single_turn
from rl_core.policy.tokens import Tokenizer, encode_prompts
from rl_core.registry import environment_factory
from rl_core.rollout.sampler import Completions
from rl_core.runtime import multihost


def collect_rollout(
    generate: Callable[..., Completions],
    tokenizer: Tokenizer,
    rollout: RolloutConfig,
    prompts: Sequence[Prompt],
    num_samples: int,
    *,
    key: jax.Array | None = None,
    row_limits: bool = False,
    sessions: Sessions | None = None,
) -> Rollout:
    """`num_samples` completions of each prompt (rows prompt-major, on the host).

    `generate(prompt_tokens, prompt_mask, num_samples=G, key=...)` samples with the
    current weights (the learner's `_generate`). Without `rollout.environment` each row
    is one generation; with one, each row is a whole episode (rl_core.episodes.runner); with
    `rollout.agent`, each row is an agent's episode (rl_core.episodes.agents).
    `key`: the first generation samples with it and the n-th turn's with fold_in(key, n),
    instead of `generate`'s own key stream. `row_limits`: the backend stops each row at its own
    `max_new_tokens` and `stop_strings` (the paged engine's `row_limits`): each episode turn asks for
    only what the episode can keep, with exactly the live rows (`run_episodes`). `sessions`: the
    backend keeps each episode's sequence between its turns (the paged engine, which `retains`):
    a turn prefills only what follows what it holds. A backend that counts them
    (`capabilities.counts_prefill`) has the rollout's prompt tokens prefilled and reused in the Rollout.
    """
    counts = _counts(sessions)
    rolled = _collect(generate, tokenizer, rollout, prompts, num_samples, key, row_limits, sessions)
    if counts is None:
        return rolled
    after = _counts(sessions)
    assert after is not None
    return rolled._replace(prefill_tokens=after[0] - counts[0], reused_tokens=after[1] - counts[1])


def _counts(backend: Any) -> tuple[int, int] | None:
    """(prompt tokens prefilled, reused) so far by `backend`, if it counts them."""
    if backend is None or not backend.capabilities.counts_prefill:
        return None
    counted = backend.counters()
    return counted.prefill_tokens, counted.reused_tokens


def _collect(generate: Callable[..., Completions], tokenizer: Tokenizer, rollout: RolloutConfig,
             prompts: Sequence[Prompt], num_samples: int, key: jax.Array | None, row_limits: bool,
             sessions: Sessions | None) -> Rollout:
    if key is not None:
        calls, stream = itertools.count(), generate

        def generate(*args: Any, **kwargs: Any) -> Completions:
            n = next(calls)
            return stream(*args, key=key if n == 0 else jax.random.fold_in(key, n), **kwargs)

    if rollout.agent is not None:  # the agent runtime serves `generate` to the agents (rl_core.episodes.agents)
        return agent_runtime()(generate, tokenizer, rollout, prompts, num_samples, sessions=sessions)
    if rollout.environment is None:
        tokens, mask = encode_prompts(tokenizer, [p.text for p in prompts], max_tokens=rollout.max_prompt_tokens)
        out = multihost.to_host(generate(tokens, mask, num_samples=num_samples))
        return single_turn(tokenizer, tokens, mask, out, num_samples)
    return run_episodes(
        lambda tokens, mask, n, **limits: generate(tokens, mask, num_samples=n, **limits),
        tokenizer,
        prompts,
        environment_factory(rollout.environment, rollout.environment_options),
        num_samples=num_samples,
        limits=EpisodeLimits.from_rollout(rollout),
        row_limits=row_limits,
        sessions=sessions,
    )
