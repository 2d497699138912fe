"""Scored groups of completions on the host, before they become a TrainExample.

A `Groups` holds whole groups (G consecutive rows per prompt), so DAPO can
drop uniform groups, collect over several generation rounds and carry the
surplus to the next step with `select` and `concat`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rl_core.data import Prompt


@dataclasses.dataclass(frozen=True)
class Groups:
    """N = num_groups * G completions, group-contiguous; arrays are numpy."""

    group_size: int
    prompts: tuple[Prompt, ...]  # one per group
    prompt_tokens: np.ndarray  # [N, P] int32, left-padded
    prompt_mask: np.ndarray  # [N, P] float32
    completion_tokens: np.ndarray  # [N, T] int32
    completion_mask: np.ndarray  # [N, T] float32
    sampler_logp: np.ndarray  # [N, T] float32
    lengths: np.ndarray  # [N] int32, tokens including EOS
    truncated: np.ndarray  # [N] bool
    texts: tuple[str, ...]  # [N] decoded completions
    rewards: np.ndarray  # [N] float32, weighted total
    reward_metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @property
    def num_groups(self) -> int:
        return len(self.prompts)

    def uniform(self) -> np.ndarray:
        """bool [num_groups]: all rewards of the group equal (max == min)."""
        r = self.rewards.reshape(-1, self.group_size)
        return r.max(axis=1) == r.min(axis=1)

    def select(self, groups: np.ndarray | Sequence[int]) -> Groups:
        """The groups at indices `groups`, in that order."""
        groups = np.asarray(groups, dtype=np.int64)
        rows = (groups[:, None] * self.group_size + np.arange(self.group_size)).reshape(-1)
        return dataclasses.replace(
            self,
            prompts=tuple(self.prompts[i] for i in groups),
            texts=tuple(self.texts[i] for i in rows),
            **{name: getattr(self, name)[rows] for name in _ROW_ARRAYS},
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable form (for checkpoints of carried-over groups)."""
        out: dict[str, Any] = {name: getattr(self, name).tolist() for name in _ROW_ARRAYS}
        out["group_size"] = self.group_size
        out["prompts"] = [{"text": p.text, "fields": dict(p.fields)} for p in self.prompts]
        out["texts"] = list(self.texts)
        out["reward_metrics"] = dict(self.reward_metrics)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Groups:
        arrays = {name: np.asarray(data[name], dtype=_DTYPES[name]) for name in _ROW_ARRAYS}
        return cls(
            group_size=int(data["group_size"]),
            prompts=tuple(Prompt(p["text"], p["fields"]) for p in data["prompts"]),
            texts=tuple(data["texts"]),
            reward_metrics=dict(data["reward_metrics"]),
            **arrays,
        )


_DTYPES = {
    "prompt_tokens": np.int32,
    "prompt_mask": np.float32,
    "completion_tokens": np.int32,
    "completion_mask": np.float32,
    "sampler_logp": np.float32,
    "lengths": np.int32,
    "truncated": bool,
    "rewards": np.float32,
}
_ROW_ARRAYS = tuple(_DTYPES)


def concat(parts: Sequence[Groups], *, pad_id: int) -> Groups:
    """Groups of several rounds in order; prompts re-padded on the left to a common width."""
    if len(parts) == 1:
        return parts[0]
    width = max(p.prompt_tokens.shape[1] for p in parts)

    def widen(x: np.ndarray, fill: float) -> np.ndarray:
        return np.pad(x, ((0, 0), (width - x.shape[1], 0)), constant_values=fill)

    arrays = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _ROW_ARRAYS if "prompt" not in name}
    return Groups(
        group_size=parts[0].group_size,
        prompts=tuple(q for p in parts for q in p.prompts),
        prompt_tokens=np.concatenate([widen(p.prompt_tokens, pad_id) for p in parts]),
        prompt_mask=np.concatenate([widen(p.prompt_mask, 0.0) for p in parts]),
        texts=tuple(t for p in parts for t in p.texts),
        reward_metrics=_weighted_metrics(parts),
        **arrays,
    )


def _weighted_metrics(parts: Sequence[Groups]) -> dict[str, float]:
    """Per-function reward metrics averaged over rounds, weighted by completions."""
    total = sum(len(p.rewards) for p in parts)
    keys = {k for p in parts for k in p.reward_metrics}
    return {
        k: sum(p.reward_metrics.get(k, 0.0) * len(p.rewards) for p in parts) / total
        for k in keys
        if not k.endswith("/std")
    }
