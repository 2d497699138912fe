"""Episodes from given model turns: supervised targets (a warm start) and test references."""

from __future__ import annotations

from collections.abc import Sequence

from rl_core.data import Prompt
from rl_core.episodes.env import Environment, checked_result
from rl_core.policy.tokens import Tokenizer


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
