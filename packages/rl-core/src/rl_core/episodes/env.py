"""The environment protocol: what answers a model turn in a multi-turn episode.

An episode is one prompt, then model turns and observations in turn:

    env = make(**options)                  # a fresh environment per episode
    first = env.reset(prompt)              # text appended to the prompt before the first turn
    result = env.step(model_turn_text)     # StepResult(observation, reward, done)
    ...                                    # until done, rollout.max_turns or the token budget

An environment keeps everything it knows about its episode in `env.state`, a
plain JSON value (dicts, lists, strings, numbers, booleans, None). The runner
records it after every step, so an episode's record can be saved with a
checkpoint, and an environment made fresh and given that state (`env.state =
saved`) continues exactly where the other stopped.

Environments are untrusted code as far as the runner is concerned: an
observation that is not a string, a reward that is not a finite number, a
state that is not JSON, or an exception, ends the episode with a one-line
error as its last observation and is counted (`episodes/env_errors`); it never
escapes the rollout or loses the other episodes.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

from rl_core.data import Prompt

JSON = Any
"""A plain JSON value: dict (str keys), list, str, int, float, bool or None."""


class StepResult(NamedTuple):
    """What an environment answers to one model turn."""

    observation: str
    """Text appended to the episode after the turn (the tool's result, the world's reply); "" for none."""
    reward: float = 0.0
    """This turn's reward (finite); the episode's reward is the sum over its turns."""
    done: bool = False
    """The episode is over: no observation tokens are added and no further turn is generated."""


@runtime_checkable
class Environment(Protocol):
    """One episode's environment (made fresh per episode by its factory)."""

    state: JSON
    """Everything the environment knows about its episode, as plain JSON data."""

    def reset(self, prompt: Prompt) -> str:
        """Start an episode on `prompt`; returns text appended to the prompt ("" for none)."""
        ...

    def step(self, text: str) -> StepResult:
        """Answer one model turn (its text, end-of-turn token removed)."""
        ...


EnvironmentFactory = Callable[..., Environment]
"""`factory(**options)` -> a fresh Environment (a class or a function)."""


class ContractError(ValueError):
    """An environment broke its contract (bad observation, reward, state or `done`)."""


def checked_result(result: Any, where: str) -> StepResult:
    """`result` as a StepResult, or ContractError saying what is wrong in one line."""
    if not isinstance(result, tuple) or len(result) != 3:
        raise ContractError(f"{where} returned {_short(result)}; expected (observation, reward, done)")
    observation, reward, done = result
    if not isinstance(observation, str):
        raise ContractError(f"{where} returned an observation of type {type(observation).__name__}, not str")
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
        raise ContractError(f"{where} returned the reward {_short(reward)}; expected a finite number")
    if not isinstance(done, (bool, int)) or isinstance(done, float):
        raise ContractError(f"{where} returned done = {_short(done)}; expected a bool")
    return StepResult(observation, float(reward), bool(done))


def checked_state(state: Any, where: str) -> JSON:
    """A deep copy of `state` through JSON, or ContractError when it is not plain data."""
    try:
        return json.loads(json.dumps(state, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ContractError(f"{where}: state is not plain JSON data ({e})") from None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
