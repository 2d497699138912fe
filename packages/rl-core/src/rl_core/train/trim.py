"""Trimming the learner's passes to the completions' actual width.

Completions are padded to max_new_tokens (T), but the log-prob, reference and
update passes only need the columns up to the longest completion: attention is
causal, so later columns change no earlier log-prob, and masked columns add
nothing to any loss. The width is rounded up to a power-of-two multiple of the
log-prob chunk (C, 2C, 4C, ... capped at T), so a run compiles at most
log2(T / C) + 1 widths of each pass, and runs whose T is at most C never trim.
"""

from __future__ import annotations

import numpy as np

from rl_core.runtime import multihost
from rl_core.types import TrainExample


def trimmed_width(mask, chunk_tokens: int) -> int:
    """The smallest chunk_tokens * 2^k covering every real column of mask [B, T], at most T."""
    real = np.asarray(multihost.to_host(mask)) > 0
    t = real.shape[1]
    columns = np.flatnonzero(real.any(axis=0))
    longest = int(columns[-1]) + 1 if len(columns) else 1
    width = chunk_tokens
    while width < longest:
        width *= 2
    return min(width, t)


def trim_example(example: TrainExample, width: int) -> TrainExample:
    """Every [B, T, ...] field cut to [B, width, ...] (prompt fields and per-completion advantages as they are)."""
    cut = lambda x: None if x is None else x[:, :width]  # noqa: E731
    advantages = example.advantages
    return example._replace(
        completion_tokens=cut(example.completion_tokens), completion_mask=cut(example.completion_mask),
        old_logp=cut(example.old_logp), ref_logp=cut(example.ref_logp), sampler_logp=cut(example.sampler_logp),
        advantages=cut(advantages) if advantages.ndim == 2 else advantages,
        returns=cut(example.returns), values=cut(example.values), teacher_logp=cut(example.teacher_logp),
        routing=cut(example.routing),
    )
