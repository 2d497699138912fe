"""The earlier segments of rewritten agent histories: training rows of their own, with their episode's advantage.

An agent that rewrites its history (summarises, truncates, reorders its messages) makes its episode
several sequences (rl_core.episodes.agents): each rewrite starts a segment, which continues as long as
the agent's requests append to it. A rollout's rows stay one per episode, each holding its episode's
last segment: the reward functions score episodes, and the advantage estimator's groups are G
episodes, so a group's statistics (its mean, its std) count episodes, never segments. `Segments`
holds every earlier segment beside the rows, each with the row of its episode; once advantages are
computed, `expand` appends them to the training batch as rows of their own, each with its episode's
advantage (one number per episode, broadcast to its segments), then pads the batch with empty rows
(no token in the loss) to a row count the update's batch layout cuts into whole micro-batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rl_core.types import TrainExample


@dataclasses.dataclass(frozen=True)
class Segments:
    """S earlier segments of the rows' episodes; arrays are numpy, completion width T = the rows'."""

    episode: np.ndarray  # [S] int64: the row (episode) each segment belongs to
    prompt_tokens: np.ndarray  # [S, P] int32, left-padded (the segment's first prompt)
    prompt_mask: np.ndarray  # [S, P] float32
    completion_tokens: np.ndarray  # [S, T] int32: the model's and the template's tokens after it
    completion_mask: np.ndarray  # [S, T] float32: 1 exactly on the model's tokens
    sampler_logp: np.ndarray  # [S, T] float32: the sampler's log-probs on the model's tokens, 0 elsewhere
    token_version: np.ndarray  # [S, T] int32: the weight version that sampled each token
    old_logp: np.ndarray | None = None
    """[S, T] float32 behaviour log-probs recorded at collection time (carried rows, as `Groups.old_logp`)."""

    def __len__(self) -> int:
        return len(self.episode)

    def missing_old_logp(self) -> bool:
        return self.old_logp is None or bool(np.isnan(self.old_logp).any())

    def select(self, rows: np.ndarray | Sequence[int]) -> Segments:
        """The segments of the episodes at `rows` (old row indices, in their new order), renumbered."""
        rows = np.asarray(rows, np.int64)
        new = {int(old): i for i, old in enumerate(rows)}
        keep = np.asarray([i for i, e in enumerate(self.episode) if int(e) in new], np.int64)
        keep = keep[np.argsort([new[int(self.episode[i])] for i in keep], kind="stable")] if len(keep) else keep
        return dataclasses.replace(
            self, episode=np.asarray([new[int(self.episode[i])] for i in keep], np.int64),
            old_logp=None if self.old_logp is None else self.old_logp[keep],
            **{name: getattr(self, name)[keep] for name in _ARRAYS})

    def to_json(self) -> dict[str, Any]:
        return {"episode": self.episode.tolist(), **{name: getattr(self, name).tolist() for name in _ARRAYS},
                "old_logp": None if self.old_logp is None else self.old_logp.tolist()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Segments:
        s = len(data["episode"])
        old = data.get("old_logp")
        return cls(episode=np.asarray(data["episode"], np.int64),
                   old_logp=None if old is None else np.asarray(old, np.float32).reshape(s, -1),
                   **{name: np.asarray(data[name], dtype).reshape(s, -1) for name, dtype in _ARRAYS.items()})


_ARRAYS = {"prompt_tokens": np.int32, "prompt_mask": np.float32, "completion_tokens": np.int32,
           "completion_mask": np.float32, "sampler_logp": np.float32, "token_version": np.int32}


def concat_segments(parts: Sequence[Segments | None], rows: Sequence[int], *, pad_id: int) -> Segments | None:
    """The segments of several row blocks in order (`rows[i]`: part i's row count), re-numbered and
    their prompts re-padded on the left to a common width; None when no part has any."""
    if all(p is None or not len(p) for p in parts):
        return None
    offsets = np.cumsum([0, *rows[:-1]])
    kept = [(p, int(o)) for p, o in zip(parts, offsets, strict=True) if p is not None and len(p)]
    width = max(p.prompt_tokens.shape[1] for p, _ in kept)

    def widen(x: np.ndarray, fill: float) -> np.ndarray:
        return np.pad(x, ((0, 0), (width - x.shape[1], 0)), constant_values=fill)

    old_logp = None
    if any(p.old_logp is not None for p, _ in kept):  # a part without them: NaN rows (still to record)
        old_logp = np.concatenate([p.old_logp if p.old_logp is not None
                                   else np.full(p.completion_mask.shape, np.nan, np.float32) for p, _ in kept])
    return Segments(
        episode=np.concatenate([p.episode + o for p, o in kept]), old_logp=old_logp,
        prompt_tokens=np.concatenate([widen(p.prompt_tokens, pad_id) for p, _ in kept]),
        prompt_mask=np.concatenate([widen(p.prompt_mask, 0.0) for p, _ in kept]),
        **{name: np.concatenate([getattr(p, name) for p, _ in kept]) for name in _ARRAYS if "prompt" not in name})


def expand(example: TrainExample, segments: Segments | None, rows: int, *, pad_id: int) -> TrainExample:
    """`example` (one row per episode, advantages [N] per episode) with the segments appended as rows,
    each with its episode's advantage, then padded with empty rows to `rows` rows (at least N + S:
    the row count the update takes; rl_core.train.layout.BatchLayout.rows_for). An empty row repeats
    the first row's prompt and has no token in the loss and advantage 0. Unchanged without segments."""
    if segments is None or not len(segments):
        return example
    adv = np.asarray(example.advantages)
    if adv.ndim != 1:
        raise ValueError(f"an agent rewrote its history ({len(segments)} earlier segments), but the advantages are "
                         f"per token {adv.shape}: a segment takes its episode's advantage, one number per episode "
                         f"(a token-level estimator such as PPO's GAE has none to give it)")
    n, s = len(adv), len(segments)
    if rows < n + s:
        raise ValueError(f"expand: {rows} rows cannot hold {n} episodes and {s} earlier segments")
    pad = rows - n - s
    width = max(example.prompt_tokens.shape[1], segments.prompt_tokens.shape[1])

    def prompts(x: np.ndarray, fill: float) -> np.ndarray:
        return np.pad(np.asarray(x), ((0, 0), (width - x.shape[1], 0)), constant_values=fill)

    def stack(rows_: Any, seg: np.ndarray, fill_from: np.ndarray, zero: bool) -> np.ndarray:
        rows_ = np.asarray(rows_)
        filler = np.zeros_like(fill_from[:1]) if zero else fill_from[:1]
        return np.concatenate([rows_, seg.astype(rows_.dtype), np.repeat(filler, pad, axis=0)])

    prompt_tokens = prompts(example.prompt_tokens, pad_id)
    prompt_mask = prompts(example.prompt_mask, 0.0)
    t = example.completion_tokens.shape[1]
    if segments.completion_tokens.shape[1] != t:
        raise ValueError(f"expand: segments are {segments.completion_tokens.shape[1]} tokens wide, the rows {t}")
    sampler = None
    if example.sampler_logp is not None:
        sampler = np.asarray(example.sampler_logp, np.float32)
        sampler = stack(sampler, segments.sampler_logp, sampler, zero=True)
    old = None
    if example.old_logp is not None or segments.old_logp is not None:  # NaN rows: still to record
        nan = lambda rows: np.full((rows, t), np.nan, np.float32)  # noqa: E731
        old = np.concatenate([nan(n) if example.old_logp is None else np.asarray(example.old_logp, np.float32),
                              nan(s) if segments.old_logp is None else segments.old_logp,
                              np.zeros((pad, t), np.float32)])
    return example._replace(
        prompt_tokens=stack(prompt_tokens, prompts(segments.prompt_tokens, pad_id), prompt_tokens, zero=False),
        prompt_mask=stack(prompt_mask, prompts(segments.prompt_mask, 0.0), prompt_mask, zero=False),
        completion_tokens=stack(example.completion_tokens, segments.completion_tokens, np.asarray(
            example.completion_tokens), zero=False),
        completion_mask=stack(example.completion_mask, segments.completion_mask, np.asarray(example.completion_mask),
                              zero=True),
        advantages=np.concatenate([adv, adv[segments.episode], np.zeros(pad, adv.dtype)]).astype(np.float32),
        sampler_logp=sampler,
        old_logp=old,
    )


__all__ = ["Segments", "concat_segments", "expand"]
