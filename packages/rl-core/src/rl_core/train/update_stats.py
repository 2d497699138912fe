"""A step's update statistics: summarised per model, and the guard against non-finite updates.

Each model's jitted update reports (loss, grad_norm, finite, empty, and its loss's
metric sums, maxima and minima); a non-finite one has already left the model as it
was (rl_core.train.trainable). The guard counts them, and stops the run when the config
says so (`on_nonfinite='stop'`) or when `max_skipped_in_a_row` come in a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rl_core.config import TrainingConfig


class NonFiniteUpdateError(RuntimeError):
    """A non-finite loss or gradient with `on_nonfinite='stop'`, or `max_skipped_in_a_row` of them."""


def summarize(results: list[Mapping[str, Any]], prefix: str) -> dict[str, float]:
    """One model's update statistics of a step: mean loss and gradient norm, counts, and the
    loss's metrics (means as sum over count, extremes over the updates with tokens)."""
    out: dict[str, float] = {
        f"{prefix}loss": float(np.mean([r["loss"] for r in results])),
        f"{prefix}grad_norm": float(np.mean([r["grad_norm"] for r in results])),
        f"{prefix}skipped_updates": float(sum(int(not r["finite"]) for r in results)),
        f"{prefix}empty_updates": float(sum(int(r["empty"]) for r in results)),
        f"{prefix}updates": float(len(results)),
    }
    for name in results[0]["means"]:
        total = sum(float(r["means"][name][0]) for r in results)
        count = sum(float(r["means"][name][1]) for r in results)
        out[name] = total / count if count else 0.0
    # extremes over the tokens trained on: an empty update has none (its +-inf is no value)
    trained = [r for r in results if not r["empty"]]
    for name in results[0]["maxima"] if trained else ():
        out[name] = max(float(r["maxima"][name]) for r in trained)
    for name in results[0]["minima"] if trained else ():
        out[name] = min(float(r["minima"][name]) for r in trained)
    return out


class UpdateGuard:
    """Counts skipped (non-finite) and empty updates over a run; raises when the run must stop."""

    def __init__(self, training: TrainingConfig) -> None:
        self.training = training
        self.skipped_updates = 0  # non-finite loss or gradient
        self.skipped_in_a_row = 0  # against training.max_skipped_in_a_row; restarts on resume
        self.empty_updates = 0  # mini-batches with no token in the loss

    def check(self, step: int, which: str, results: list[Mapping[str, Any]]) -> None:
        """Count `results`, the updates named `which` (e.g. "updates", "critic updates") of `step`."""
        empty = sum(int(r["empty"]) for r in results)
        skipped = sum(int(not r["finite"]) for r in results)
        self.skipped_updates += skipped
        self.empty_updates += empty
        if skipped and self.training.on_nonfinite == "stop":
            raise NonFiniteUpdateError(
                f"step {step}: {skipped} of {len(results)} {which} had a non-finite loss or gradient "
                f"(loss values {[float(r['loss']) for r in results]}); parameters were left unchanged. "
                "Lower the learning rate, check rewards and inputs, or set on_nonfinite='skip'."
            )
        for r in results:
            self.skipped_in_a_row = 0 if r["finite"] else self.skipped_in_a_row + 1
        limit = self.training.max_skipped_in_a_row
        if limit and self.skipped_in_a_row >= limit:
            raise NonFiniteUpdateError(
                f"step {step}: the last {self.skipped_in_a_row} {which} in a row had a non-finite loss or "
                "gradient and were skipped (training.max_skipped_in_a_row = "
                f"{limit}); check the model's weights, the rewards and the inputs, or lower the learning rate"
            )
