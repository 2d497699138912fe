"""A step's update statistics: summarised per model, and the guard against non-finite updates.

Each model's jitted update reports (loss, grad_norm, finite, empty, and its loss's
metric sums, maxima and minima); a non-finite one has already left the model as it
was (rl_core.train.trainable). The guard (`guard_updates`) counts them in the learner's state, and stops the run when the config
says so (`on_nonfinite='stop'`) or when `max_skipped_in_a_row` come in a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

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


class UpdateCounts(NamedTuple):
    """A run's counts of the updates the guard watches: part of the learner's state
    (rl_core.learner.state.LearnerState), so a resumed run counts on as if it had not stopped."""

    skipped: int = 0
    """Updates with a non-finite loss or gradient (left out of the parameters)."""
    skipped_in_a_row: int = 0
    """The last updates' non-finite run, against training.max_skipped_in_a_row."""
    empty: int = 0
    """Mini-batches with no token in the loss."""


def guard_updates(counts: UpdateCounts, training: TrainingConfig, step: int, which: str,
                  results: list[Mapping[str, Any]]) -> UpdateCounts:
    """`counts` with `results`, the updates named `which` (e.g. "updates", "critic updates") of `step`,
    counted; raises NonFiniteUpdateError when the run must stop."""
    skipped = sum(int(not r["finite"]) for r in results)
    in_a_row = counts.skipped_in_a_row
    for r in results:
        in_a_row = 0 if r["finite"] else in_a_row + 1
    counts = UpdateCounts(counts.skipped + skipped, in_a_row, counts.empty + sum(int(r["empty"]) for r in results))
    if skipped and training.on_nonfinite == "stop":
        raise NonFiniteUpdateError(
            f"step {step}: {skipped} of {len(results)} {which} had a non-finite loss or gradient "
            f"(loss values {[float(r['loss']) for r in results]}); parameters were left unchanged. "
            "Lower the learning rate, check rewards and inputs, or set on_nonfinite='skip'."
        )
    limit = training.max_skipped_in_a_row
    if limit and in_a_row >= limit:
        raise NonFiniteUpdateError(
            f"step {step}: the last {in_a_row} {which} in a row had a non-finite loss or "
            "gradient and were skipped (training.max_skipped_in_a_row = "
            f"{limit}); check the model's weights, the rewards and the inputs, or lower the learning rate"
        )
    return counts
