"""A step's update, as functions of values: `num_iterations` passes of one optimizer step per
mini-batch for each trained model (rl_core.train.trainable.TrainableModel.update, the jitted
program), and what the step reports of them (the non-finite guard's counts carried in the state)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from rl_core.learner.meter import Meter
from rl_core.learner.state import POLICY
from rl_core.runtime import multihost
from rl_core.train.layout import BatchLayout
from rl_core.train.trainable import TrainableModel, TrainState
from rl_core.train.trim import trim_example, trimmed_width
from rl_core.train.update_stats import UpdateCounts, guard_updates, summarize
from rl_core.types import TrainExample


def run_updates(parts: Mapping[str, TrainableModel], states: Mapping[str, TrainState], example: TrainExample, *,
                names: Sequence[str], iterations: int, layout: BatchLayout, chunk_tokens: int,
                meter: Meter | None = None
                ) -> tuple[dict[str, TrainState], dict[str, list[dict[str, Any]]], dict[str, float]]:
    """The models `names` trained in turn on each mini-batch of `example`, `iterations` times:
    the new states, each model's update statistics on the host in order (loss, grad_norm, finite,
    empty, its loss's metric sums) and, with a meter, the seconds of each model's updates but the
    policy's, timed apart (`time/<name>_update`)."""
    # only the columns up to the longest completion (a bucketed width; see rl_core.train.trim)
    example = trim_example(example, trimmed_width(example.completion_mask, chunk_tokens))
    minis = layout.mini_batches(example)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    models = dict(states)
    # with a meter, each other model's updates are timed apart: wait for the work before and after them
    other_update_seconds = {name: 0.0 for name in names if name != POLICY} if meter is not None else {}
    for _ in range(iterations):
        for mini in minis:
            for name in names:
                if name in other_update_seconds:
                    jax.block_until_ready(models)
                    start = time.perf_counter()
                models[name], stats = parts[name].update(models[name], mini)
                if name in other_update_seconds:
                    jax.block_until_ready(models[name])
                    other_update_seconds[name] += time.perf_counter() - start
                if meter is not None:
                    meter.updated(name, mini)
                results[name].append(stats)
    times = {f"time/{name}_update": seconds for name, seconds in other_update_seconds.items()}
    return models, multihost.to_host(results), times


def update_metrics(results: Mapping[str, list[dict[str, Any]]], counts: UpdateCounts, training: Any, step: int
                   ) -> tuple[UpdateCounts, dict[str, float]]:
    """Each model's updates summarised, the policy's as train/..., another's as <name>/..., and the
    guard's counts past them (a non-finite update beyond what `training` allows raises)."""
    out: dict[str, float] = {}
    for name, stats in results.items():
        if stats:  # a model left out of this step (e.g. the policy in PPO's critic warm-up) has none
            counts = guard_updates(counts, training, step, "updates" if name == POLICY else f"{name} updates", stats)
            out.update(summarize(stats, "train/" if name == POLICY else f"{name}/"))
    return counts, out
