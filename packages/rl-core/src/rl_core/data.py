"""Prompts and the deterministic, resumable order in which they are drawn."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

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
    stores the position and resume is exact. `at(position, n)` reads it there;
    `next(n)` reads it at the stream's own cursor and advances that (for callers
    outside a learner: a learner keeps its position in its state).
    """

    def __init__(self, dataset: Sequence[Prompt] | PromptDataset, *, seed: int, position: int = 0) -> None:
        if len(dataset) == 0:
            raise ValueError("the prompt dataset is empty")
        self.dataset = dataset
        self.seed = seed
        self.position = position
        self._orders: dict[int, np.ndarray] = {}  # a memo of epochs' permutations (pure)

    def _order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            order = np.random.default_rng((self.seed, epoch)).permutation(len(self.dataset))
            self._orders = {epoch: order}  # the epoch in use only (a dataset may be large)
        return order

    def at(self, position: int, n: int) -> list[Prompt]:
        """The `n` prompts from `position` on."""
        out = []
        for i in range(position, position + n):
            epoch, offset = divmod(i, len(self.dataset))
            out.append(self.dataset[int(self._order(epoch)[offset])])
        return out

    def next(self, n: int) -> list[Prompt]:
        """The next `n` prompts at the stream's own cursor; advances the cursor."""
        out = self.at(self.position, n)
        self.position += n
        return out


class CollectionInputs(NamedTuple):
    """A collection's inputs besides its prompts, which it hands back changed (a value, "the
    supply"; the learner keeps the one a collection returns): the prompt stream from `position` on (DAPO
    draws more prompts), the algorithm's `carry` (DAPO's surplus groups) and the PRNG key
    `rng` its samples' keys are split from."""

    stream: PromptStream
    position: int
    carry: Any = None
    rng: Any = None

    def draw(self, n: int) -> tuple[list[Prompt], CollectionInputs]:
        """The next `n` prompts and the supply past them."""
        return self.stream.at(self.position, n), self._replace(position=self.position + n)
