"""Prompts and the deterministic, resumable order in which they are drawn."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One task instance: the text the policy sees and the fields its rewards need."""

    text: str
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """E.g. {"answer": "42"}; passed to reward functions by name."""


class PromptDataset(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Prompt: ...


class PromptStream:
    """Endless shuffled epochs over a dataset, positioned by one integer.

    Epoch e is the permutation drawn from (seed, e), so the stream at
    `position` is a pure function of (dataset, seed, position): a checkpoint
    stores the position and resume is exact.
    """

    def __init__(self, dataset: Sequence[Prompt] | PromptDataset, *, seed: int, position: int = 0) -> None:
        if len(dataset) == 0:
            raise ValueError("the prompt dataset is empty")
        self.dataset = dataset
        self.seed = seed
        self.position = position
        self._epoch = -1
        self._order = np.arange(0)

    def next(self, n: int) -> list[Prompt]:
        """The next `n` prompts; advances the position."""
        out = []
        for _ in range(n):
            epoch, offset = divmod(self.position, len(self.dataset))
            if epoch != self._epoch:
                self._epoch = epoch
                self._order = np.random.default_rng((self.seed, epoch)).permutation(len(self.dataset))
            out.append(self.dataset[int(self._order[offset])])
            self.position += 1
        return out
