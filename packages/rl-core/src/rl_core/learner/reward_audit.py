"""What a learner tells a reward audit each step (the trainer's is rewards.auditor.RewardAuditor).

A learner given a `RewardAudit` calls it once per step with the rewards of the groups it
trains on, as plain values, and adds the metrics it returns to the step's (`reward_audit/*`).
What the audit carries from step to step (streaks) goes into each checkpoint, so a resumed
run's metrics are those of a run that never stopped.
rl_core imports no reward package: this protocol is the whole contract.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class RewardAudit(Protocol):
    def __call__(self, *, step: int, total: Sequence[float], per_function: Mapping[str, Sequence[float]],
                 weights: Mapping[str, float], lengths: Sequence[float], finished: Sequence[bool],
                 group_size: int) -> Mapping[str, float]:
        """The audit metrics of step `step`: `total` and `per_function` (unweighted) rewards of
        B*G completions in groups of `group_size`, each function's weight, the completions'
        lengths in tokens and whether each finished (EOS or a stop, not cut at max_new_tokens)."""

    def state_json(self) -> dict[str, Any]:
        """What carries from step to step, as the JSON a checkpoint holds."""

    def restore_json(self, data: Mapping[str, Any]) -> None:
        """Continue from what `state_json` returned ({} for a checkpoint written without it)."""
