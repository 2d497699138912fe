"""The episode's own reward, for rows that are episodes (an environment's or an agent's)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def episode_reward(prompts: Sequence[str], completions: Sequence[str], *,
                   episode: Sequence[Mapping[str, object]] | None = None, **_: object) -> list[float]:
    """Each row's `episode["reward"]`: an environment's per-turn rewards summed, or the number an agent
    returned (`rollout.agent`); 0 for an episode that ended with an error. Rows that are not episodes
    are a ValueError."""
    if episode is None:
        raise ValueError("episode_reward scores episodes: set rollout.environment or rollout.agent")
    if len(episode) != len(completions):
        raise ValueError(f"episode_reward got {len(episode)} episodes for {len(completions)} completions")
    scores = []
    for record in episode:
        value = record.get("reward", 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"episode_reward: an episode's reward is {value!r}, not a finite number")
        scores.append(float(value))
    return scores
