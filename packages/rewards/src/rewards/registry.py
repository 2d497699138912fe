"""Reward functions by stable name, for configs (e.g. a trainer's YAML).

``REWARD_FUNCTIONS[name]`` is a factory: call it with the reward's keyword
parameters (or none, for the defaults) to get a reward function whose
``__name__`` is ``name``. A fixed, read-only table: nothing registers by import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from rewards.countdown import countdown_reward
from rewards.episodes import episode_reward
from rewards.formatting import format_reward
from rewards.length import length_penalty
from rewards.math_answers import boxed_reward, gsm8k_reward, numeric_answer_reward
from rewards.names import lookup
from rewards.remote import remote_judge, remote_score

__all__ = ["REWARD_FUNCTIONS", "RewardFn", "make_reward"]

RewardFn = Callable[..., list[float]]
"""``fn(prompts: list[str], completions: list[str], **fields) -> list[float]``, one score per completion."""


def _without_parameters(fn: RewardFn) -> Callable[[], RewardFn]:
    def factory() -> RewardFn:
        return fn

    factory.__name__ = factory.__qualname__ = fn.__name__
    factory.__doc__ = f"Returns ``{fn.__name__}``, which has no parameters."
    return factory


def format_strict(*, think_tag: str = "think", answer_tag: str = "answer") -> RewardFn:
    """``format_reward(strict=True, ...)``."""
    return format_reward(strict=True, think_tag=think_tag, answer_tag=answer_tag)


def format_lenient(*, think_tag: str = "think", answer_tag: str = "answer") -> RewardFn:
    """``format_reward(strict=False, ...)``."""
    return format_reward(strict=False, think_tag=think_tag, answer_tag=answer_tag)


REWARD_FUNCTIONS: Mapping[str, Callable[..., RewardFn]] = MappingProxyType(
    {
        "numeric_answer": numeric_answer_reward,
        "gsm8k": _without_parameters(gsm8k_reward),
        "boxed": _without_parameters(boxed_reward),
        "format_strict": format_strict,
        "format_lenient": format_lenient,
        "countdown": countdown_reward,
        "length_penalty": length_penalty,
        "remote_score": remote_score,
        "remote_judge": remote_judge,
        "episode_reward": _without_parameters(episode_reward),
    }
)


def make_reward(name: str, **params: object) -> RewardFn:
    """The reward function ``REWARD_FUNCTIONS[name](**params)``; an unknown name raises listing the known ones."""
    return lookup(REWARD_FUNCTIONS, name, "reward function")(**params)
