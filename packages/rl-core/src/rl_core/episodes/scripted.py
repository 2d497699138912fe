"""Episodes from given model turns: supervised targets (a warm start) and test references."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from rl_core.data import Prompt
from rl_core.episodes.env import Environment, checked_result
from rl_core.episodes.runner import EpisodeLimits, EpisodeRecord, run_episodes
from rl_core.policy.tokens import Tokenizer
from rl_core.rollout.sampler import Completions


def scripted_episode(
    tokenizer: Tokenizer, env: Environment, prompt: Prompt, turns: Sequence[str], *, turn_ends_with_eos: bool = True
) -> tuple[str, list[int], list[float]]:
    """(prompt text, tokens after the prompt, model mask) of the episode in which the model says `turns`.

    The environment answers every turn but the last, exactly as in a rollout, so a
    warm start on these sequences shows the model the observations it will see.
    Each model turn ends with the first EOS token (`turn_ends_with_eos`).
    """
    first = env.reset(prompt)
    tokens: list[int] = []
    mask: list[float] = []
    for k, turn in enumerate(turns):
        ids = tokenizer.encode(turn) + ([tokenizer.eos_ids[0]] if turn_ends_with_eos else [])
        tokens += ids
        mask += [1.0] * len(ids)
        if k == len(turns) - 1:
            break
        result = checked_result(env.step(turn), f"{type(env).__name__}.step")
        if result.done:
            raise ValueError(f"the environment ended the episode after turn {k + 1} of {len(turns)}: {turn!r}")
        observation = tokenizer.encode(result.observation)
        tokens += observation
        mask += [0.0] * len(observation)
    return prompt.text + first, tokens, mask


def first_turn_episodes(
    tokenizer: Tokenizer, prompts: Sequence[Prompt], turns: Sequence[str], make_env: Callable[[], Environment],
    *, limits: EpisodeLimits,
) -> tuple[EpisodeRecord, ...]:
    """The record of each episode in which the model's first turn is `turns[i]` (on `prompts[i]`), ended by
    EOS, and it says no more: a fresh environment answers that one turn, exactly as in a rollout (its stop
    strings, the limits, a broken contract recorded), so reward functions that read `episode` can score
    given texts (the reward audit's probe)."""
    if len(prompts) != len(turns):
        raise ValueError(f"first_turn_episodes: {len(prompts)} prompts but {len(turns)} turns")
    rows = [tokenizer.encode(t) + [tokenizer.eos_ids[0]] for t in turns]
    width = max(map(len, rows), default=1)

    def say(tokens: np.ndarray, mask: np.ndarray, n: int) -> Completions:  # one row per prompt, in order
        out = np.full((len(rows), width), tokenizer.pad_id, np.int32)
        for i, row in enumerate(rows):
            out[i, : len(row)] = row
        lengths = np.asarray([len(r) for r in rows], np.int32)
        return Completions(tokens=out, logp=np.zeros(out.shape, np.float32),
                           mask=(np.arange(width) < lengths[:, None]).astype(np.float32), lengths=lengths,
                           truncated=np.zeros(len(rows), bool))

    one_turn = dataclasses.replace(limits, max_turns=1)
    return run_episodes(say, tokenizer, prompts, make_env, num_samples=1, limits=one_turn).episodes
