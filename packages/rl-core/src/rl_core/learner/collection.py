"""The pipeline's collection, as functions of values: a rollout's completions as unscored
`Groups` (`groups_of_rollout`) and the reward manager's scores filled in (`score_groups`), each
counting what it cost into the collection's tally (rl_core.learner.draw)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from rl_core.data import Prompt
from rl_core.episodes.runner import Rollout
from rl_core.learner.groups import Groups
from rl_core.runtime import multihost


def groups_of_rollout(prompts: Sequence[Prompt], rolled: Rollout, *, group_size: int, version: int,
                      tally: dict[str, float]) -> Groups:
    """The rollout's G completions (or episodes) per prompt, rewards not yet filled in, sampled by
    the weights of step count `version`; tokens decoded and kept counted into `tally`."""
    out = rolled.completions
    kept = float(int(out.lengths.sum()))
    decoded = kept if rolled.decoded_tokens is None else float(rolled.decoded_tokens)
    tally["perf/generated_tokens"] = tally.get("perf/generated_tokens", 0.0) + decoded
    tally["perf/kept_tokens"] = tally.get("perf/kept_tokens", 0.0) + kept
    if rolled.prefill_tokens is not None:  # a backend that counts them (the paged engine)
        for name, value in (("perf/prefill_tokens", rolled.prefill_tokens),
                            ("perf/reused_prefix_tokens", rolled.reused_tokens or 0)):
            tally[name] = tally.get(name, 0.0) + float(value)
    return Groups(
        group_size=group_size,
        prompts=tuple(prompts),
        prompt_tokens=rolled.prompt_tokens,
        prompt_mask=rolled.prompt_mask,
        completion_tokens=np.asarray(out.tokens),
        completion_mask=np.asarray(out.mask),
        sampler_logp=np.asarray(out.logp),
        token_version=None if out.token_version is None else np.asarray(out.token_version, np.int32),
        lengths=np.asarray(out.lengths),
        truncated=np.asarray(out.truncated),
        texts=rolled.texts,
        rewards=np.zeros(len(out.lengths), np.float32),
        row_fields=rolled.row_fields(),
        versions=np.full(len(out.lengths), version, np.int32),
        segments=rolled.segments,
    )


def score_groups(groups: Groups, reward_manager: Any, *, step: int, tally: dict[str, float]) -> Groups:
    """`groups` with the reward manager's scores (task fields passed by name), its seconds and
    failures counted into `tally`. In a multi-process run each process scores its own block of
    whole groups (reward functions are the costly host work) and the scores are gathered, so
    every process then takes the same decisions on the same numbers."""
    start = time.perf_counter()
    g = groups.group_size
    counts = [n * g for n in multihost.split_counts(groups.num_groups)]
    own = multihost.own_block(groups.num_groups)
    mine = groups.select(np.arange(groups.num_groups)[own])
    prompts = [p for p in mine.prompts for _ in range(g)]
    names = sorted({k for p in mine.prompts for k in p.fields})
    fields = {k: [p.fields.get(k) for p in prompts] for k in names}
    fields["completion_lengths"] = [int(n) for n in mine.lengths]  # model tokens, in an episode
    fields.update({k: list(v) for k, v in mine.row_fields.items()})  # e.g. each row's `episode`
    fields["completion_ids"] = [row[:n].tolist() for row, n in zip(mine.completion_tokens, mine.lengths)]  # TRL's
    result = reward_manager.score([p.text for p in prompts], list(mine.texts), fields, step=step)
    tally["time/reward"] += time.perf_counter() - start
    gather = lambda x: multihost.gather_rows(np.asarray(x, np.float32), counts)  # noqa: E731
    failed = int(multihost.gather_rows(np.asarray([result.num_failed]), [1] * len(counts)).sum())
    tally["rewards/failed"] = tally.get("rewards/failed", 0.0) + float(failed)
    for name, value in result.function_metrics.items():  # this process's, summed over the step's rounds
        tally[name] = tally.get(name, 0.0) + value
    return dataclasses.replace(groups, rewards=gather(result.total),
                               reward_scores={k: gather(v) for k, v in result.per_function.items()})
