"""What a learner reports of the work it does, for a benchmark to count (`trainer bench`).

A learner given a `Meter` calls it with the rows each model phase processes, as values:
nothing patches the learner to see them. Times come out of the step's metrics
(`time/rollout`, `time/reward`, `time/logprob`, `time/update`); with a meter the learner
also times each model's updates but the policy's apart (`time/<name>_update`, waiting for
the work before and after them, which a real run would overlap a little).
"""

from __future__ import annotations

from typing import Any, Protocol


class Meter(Protocol):
    def generated(self, prompt_mask: Any, lengths: Any, num_samples: int) -> None:
        """A generation: `num_samples` completions of `lengths` tokens for each prompt row of `prompt_mask`."""

    def scored(self, model: str, example: Any) -> None:
        """A pass of `model` outside the update over the example's rows (log-probs, a critic's values)."""

    def trained(self, example: Any, passes: int) -> None:
        """The step's batch, trained on `passes` times."""

    def updated(self, model: str, batch: Any) -> None:
        """One update of `model` on a mini-batch (micro-batches stacked on axis 0)."""
