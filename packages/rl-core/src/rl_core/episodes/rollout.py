"""The learner's rollout step: prompts to completions, single-turn or as episodes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rl_core.runtime import multihost
from rl_core.config import RolloutConfig
from rl_core.data import Prompt
from rl_core.episodes.runner import EpisodeLimits, Rollout, run_episodes, single_turn
from rl_core.registry import environment_factory
from rl_core.rollout.sampler import Completions
from rl_core.policy.tokens import Tokenizer, encode_prompts


def rollout_prompts(
    generate: Callable[..., Completions],
    tokenizer: Tokenizer,
    rollout: RolloutConfig,
    prompts: Sequence[Prompt],
    num_samples: int,
) -> Rollout:
    """`num_samples` completions of each prompt (rows prompt-major, on the host).

    `generate(prompt_tokens, prompt_mask, num_samples=G)` samples with the current
    weights (the learner's `generate`). Without `rollout.environment` each row is one
    generation; with one, each row is a whole episode (rl_core.episodes.runner).
    """
    if rollout.environment is None:
        tokens, mask = encode_prompts(tokenizer, [p.text for p in prompts], max_tokens=rollout.max_prompt_tokens)
        out = multihost.to_host(generate(tokens, mask, num_samples=num_samples))
        return single_turn(tokenizer, tokens, mask, out, num_samples)
    return run_episodes(
        lambda tokens, mask, n: generate(tokens, mask, num_samples=n),
        tokenizer,
        prompts,
        environment_factory(rollout.environment, rollout.environment_options),
        num_samples=num_samples,
        limits=EpisodeLimits.from_rollout(rollout),
    )
