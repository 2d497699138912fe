"""A task: prompts with the fields its rewards need, a fixed held-out split, the rewards that
score it, and for each prompt one correct completion (the warm start imitates those)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rewards import RewardSpec
from rl_core import Prompt


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    description: str
    train: tuple[Prompt, ...]
    heldout: tuple[Prompt, ...]
    rewards: tuple[RewardSpec, ...]
    correct: str
    """Name of the reward function whose score 1.0 means the answer is correct."""
    teacher: Callable[[Prompt, np.random.Generator], str | list[str]]
    """The warm start's target completion for a prompt (may be deliberately fallible); with an
    environment, the model's turns."""
    max_prompt_tokens: int
    max_new_tokens: int
    chat: bool | None = False
    """Render prompts with the tokenizer's chat template (a text prompt as one user message, a
    `trainer.tasks.rows.RowPrompt` as its messages); False: as plain text; None: the template
    when the tokenizer has one, plain text otherwise."""
    template_options: dict = dataclasses.field(default_factory=dict)
    """Variables for the chat template (e.g. {"enable_thinking": False} for Qwen3)."""
    environment: str | None = None
    """Multi-turn: the registered environment that answers the model's turns (rollout.environment);
    the teacher then returns the model's turns (a list of texts) and max_new_tokens is the
    episode's budget after the prompt."""
    environment_options: dict = dataclasses.field(default_factory=dict)
    max_turns: int = 1
    max_turn_tokens: int = 0
    judge: dict = dataclasses.field(default_factory=dict)
    """Defaults of the run's `judge:` settings for a task whose reward is a judge model's (trainer.judge)."""
    judge_examples: Callable[[np.random.Generator, int], list[tuple[str, str, str, bool]]] | None = None
    """`(rng, count)` -> (prompt, completion, reference, correct) examples a judge is warm-started on
    (judge.train_steps); None: the task brings none."""


def split_heldout(problems: list, heldout_size: int, seed: int) -> tuple[list, list]:
    """A seeded shuffle, cut into (train, held-out): the split is fixed by the seed."""
    order = np.random.default_rng(seed).permutation(len(problems))
    shuffled = [problems[i] for i in order]
    return shuffled[heldout_size:], shuffled[:heldout_size]


def check_heldout(heldout_size: int, problems: int) -> None:
    if not 1 <= heldout_size < problems:
        rule = "must be >= 1" if heldout_size < 1 else f"must be less than the task's {problems} problems"
        raise ValueError(f"heldout_size = {heldout_size!r}: {rule}")


def heldout_file(heldout_data: str, data: str, read: Callable[[str], list]) -> list:
    """`read(heldout_data)`: the rows of a held-out file of its own (`task.options.heldout_data`), every
    error naming the option (a ValueError the settings report as `task.options.heldout_data = ...`)."""
    if Path(heldout_data).resolve() == Path(data).resolve():  # every held-out row would also train
        raise ValueError(f"heldout_data = {heldout_data!r}: is the training data itself; name a file of other rows")
    try:
        rows = read(heldout_data)
    except ValueError as e:  # DataError: the file, the line and what is wrong
        raise ValueError(f"heldout_data = {heldout_data!r}: {e}") from None
    if not rows:
        raise ValueError(f"heldout_data = {heldout_data!r}: holds no rows")
    return rows
