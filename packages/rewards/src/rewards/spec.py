"""One reward function in a manager: ``RewardSpec`` (its weight, name, routing, timeout and failure policy)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from rewards.scores import ON_ERROR_CHOICES

__all__ = ["RewardSpec"]


@dataclass(frozen=True)
class RewardSpec:
    """One reward function in a manager, with its weight, its name and how it is called."""

    fn: Callable[..., Sequence[float | None]] | Callable[..., Awaitable[Sequence[float | None]]]
    """Called as ``fn(prompts, completions, **fields)`` (or with every argument by keyword, TRL's way,
    when it names a parameter ``prompts`` or ``completions``); returns one score or ``None`` per
    completion. An ``async def`` function is awaited, concurrently with the manager's other async ones."""
    weight: float = 1.0
    """Multiplies this function's scores in the total; its own scores are reported unweighted."""
    name: str | None = None
    """Key in ``RewardResult.per_function`` and in metrics; defaults to ``fn.__name__``."""
    data_sources: tuple[str, ...] | None = None
    """Score only rows whose field ``data_source`` is one of these (verl's routing); the others get
    ``None`` from it. None: every row."""
    timeout_s: float | None = None
    """A call that has not returned after this many seconds fails (its thread is left behind)."""
    on_failure: str | None = None
    """One of ``ON_ERROR_CHOICES`` for this function's failures; None: the manager's ``on_error``."""

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"RewardSpec.fn must be callable, got {self.fn!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, numbers.Real) or not math.isfinite(self.weight):
            raise ValueError(f"RewardSpec.weight must be a finite number, got {self.weight!r}")
        name = self.name if self.name is not None else getattr(self.fn, "__name__", None)
        if not isinstance(name, str) or not name or name == "<lambda>":
            raise ValueError(f"reward function {self.fn!r} needs a name: pass RewardSpec(fn, name='...')")
        if self.data_sources is not None:
            if isinstance(self.data_sources, str) or not all(isinstance(d, str) for d in self.data_sources):
                raise ValueError(f"RewardSpec.data_sources must be a list of names, got {self.data_sources!r}")
            object.__setattr__(self, "data_sources", tuple(self.data_sources))
        if self.timeout_s is not None and (isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, numbers.Real)
                                           or not self.timeout_s > 0):
            raise ValueError(f"RewardSpec.timeout_s must be a number of seconds > 0, got {self.timeout_s!r}")
        if self.on_failure is not None and self.on_failure not in ON_ERROR_CHOICES:
            raise ValueError(f"RewardSpec.on_failure must be one of {ON_ERROR_CHOICES}, got {self.on_failure!r}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "weight", float(self.weight))
