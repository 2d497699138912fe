"""The built-in reward factories, declared as entry points of the group ``rewards.functions`` in this
package's pyproject.toml, the way any other package declares its own (see ``rewards.registry``).

Each value is a factory: called with the reward's options (or none, for the defaults) it returns a
reward function whose ``__name__`` is the entry point's name.
"""

from __future__ import annotations

from collections.abc import Callable

from rewards.countdown import countdown_reward as countdown
from rewards.episodes import episode_reward as _episode_reward
from rewards.formatting import format_reward
from rewards.length import length_penalty
from rewards.math_answers import boxed_reward, gsm8k_reward
from rewards.math_answers import numeric_answer_reward as numeric_answer
from rewards.remote import remote_judge, remote_score

__all__ = ["boxed", "countdown", "episode_reward", "format_lenient", "format_strict", "gsm8k", "length_penalty", "numeric_answer",
           "remote_judge", "remote_score"]

RewardFn = Callable[..., list[float]]


def _without_parameters(fn: RewardFn) -> Callable[[], RewardFn]:
    def factory() -> RewardFn:
        return fn

    factory.__name__ = factory.__qualname__ = fn.__name__
    factory.__doc__ = f"Returns ``{fn.__name__}``, which has no parameters."
    return factory


gsm8k = _without_parameters(gsm8k_reward)
boxed = _without_parameters(boxed_reward)
episode_reward = _without_parameters(_episode_reward)


def format_strict(*, think_tag: str = "think", answer_tag: str = "answer") -> RewardFn:
    """``format_reward(strict=True, ...)``."""
    return format_reward(strict=True, think_tag=think_tag, answer_tag=answer_tag)


def format_lenient(*, think_tag: str = "think", answer_tag: str = "answer") -> RewardFn:
    """``format_reward(strict=False, ...)``."""
    return format_reward(strict=False, think_tag=think_tag, answer_tag=answer_tag)
