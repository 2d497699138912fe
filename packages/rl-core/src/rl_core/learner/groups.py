"""Scored groups of completions on the host, before they become a TrainExample.

A `Groups` holds whole groups (G consecutive rows per prompt), so DAPO can
drop uninformative groups, collect over several generation rounds and carry
the surplus to the next step with `select` and `concat`. Each row keeps what
later steps need to weigh it correctly: every reward function's own score
(the filter and the metrics look at them) and, once recorded, the log-probs
of the policy that sampled it (`old_logp`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rl_core.data import Prompt
from rl_core.episodes.segments import Segments, concat_segments

TOTAL = "total"
"""The name under which `Groups.scores` gives the weighted total reward."""


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
    reward_scores: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """Each reward function's unweighted scores [N] float32, by name."""
    old_logp: np.ndarray | None = None
    """[N, T] float32 log-probs of the sampling policy from the trainer's forward pass, recorded
    at collection time; None = recorded for no row, a NaN row = not recorded for that row."""
    token_version: np.ndarray | None = None
    """[N, T] int32: the weight version (step count) that sampled each completion token, as the
    rollout backend reported it (mixed within a row with partial rollouts); None = not reported
    (multi-turn episodes)."""
    routing: np.ndarray | None = None
    """[N, T, layers, k] int32: a mixture of experts' rollout routing (rl_core.rollout.sampler.
    Completions.routing), kept when algorithm.routing_replay = rollout; None otherwise."""
    row_fields: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    """Per-row JSON values passed to reward functions by name, e.g. `episode` (each episode's
    record, rl_core.episodes.EpisodeRecord.to_json) for multi-turn rollouts."""
    versions: np.ndarray | None = None
    """[N] int32: the step count of the weights that sampled each row (0: the initial weights);
    rows of one batch differ when DAPO carries groups over or rollouts run ahead. None: not
    recorded (groups built by hand, a checkpoint written before rows carried it). With partial
    rollouts, the weights its collection started with; later tokens may be newer (`token_version`)."""
    segments: Segments | None = None
    """The earlier segments of the rows' episodes whose agent rewrote its history, each trained as a
    row of its own with its episode's advantage (rl_core.episodes.segments); None: none."""
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """JSON facts about the batch as a whole, recorded while collecting it, read when it is
    trained on (possibly a step later, or after a resume): timings, token counts, DAPO's
    sampling counts. `select` keeps them, `concat` starts afresh."""

    @property
    def num_groups(self) -> int:
        return len(self.prompts)

    def scores(self, name: str) -> np.ndarray:
        """[N] scores of the reward function `name`, or the weighted total for "total"."""
        if name == TOTAL:
            return self.rewards
        if name not in self.reward_scores:
            known = ", ".join([TOTAL, *self.reward_scores])
            raise KeyError(f"no reward function named {name!r} scored these groups; known: {known}")
        return self.reward_scores[name]

    def uniform(self, by: str = TOTAL) -> np.ndarray:
        """bool [num_groups]: every completion of the group has the same score under `by`.

        For a 0/1 correctness reward, "not uniform" is DAPO's 0 < #correct < G.
        """
        r = self.scores(by).reshape(-1, self.group_size)
        return r.max(axis=1) == r.min(axis=1)

    def missing_old_logp(self) -> np.ndarray:
        """bool [N]: rows whose behaviour log-probs are not recorded yet."""
        if self.old_logp is None:
            return np.ones(len(self.rewards), bool)
        return np.isnan(self.old_logp).any(axis=1)

    def select(self, groups: np.ndarray | Sequence[int]) -> Groups:
        """The groups at indices `groups`, in that order."""
        groups = np.asarray(groups, dtype=np.int64)
        rows = (groups[:, None] * self.group_size + np.arange(self.group_size)).reshape(-1)
        return dataclasses.replace(
            self,
            prompts=tuple(self.prompts[i] for i in groups),
            texts=tuple(self.texts[i] for i in rows),
            reward_scores={k: v[rows] for k, v in self.reward_scores.items()},
            old_logp=None if self.old_logp is None else self.old_logp[rows],
            versions=None if self.versions is None else self.versions[rows],
            token_version=None if self.token_version is None else self.token_version[rows],
            routing=None if self.routing is None else self.routing[rows],
            row_fields={k: tuple(v[i] for i in rows) for k, v in self.row_fields.items()},
            segments=None if self.segments is None else self.segments.select(rows),
            **{name: getattr(self, name)[rows] for name in _ROW_ARRAYS},
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable form (for checkpoints of carried-over groups)."""
        out: dict[str, Any] = {name: getattr(self, name).tolist() for name in _ROW_ARRAYS}
        out["group_size"] = self.group_size
        out["prompts"] = [{"text": p.text, "fields": dict(p.fields)} for p in self.prompts]
        out["texts"] = list(self.texts)
        out["reward_scores"] = {k: v.tolist() for k, v in self.reward_scores.items()}
        out["old_logp"] = None if self.old_logp is None else self.old_logp.tolist()
        out["token_version"] = None if self.token_version is None else self.token_version.tolist()
        out["routing"] = None if self.routing is None else self.routing.tolist()
        out["row_fields"] = {k: list(v) for k, v in self.row_fields.items()}
        out["versions"] = None if self.versions is None else self.versions.tolist()
        out["segments"] = None if self.segments is None else self.segments.to_json()
        out["info"] = dict(self.info)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Groups:
        arrays = {name: np.asarray(data[name], dtype=_DTYPES[name]) for name in _ROW_ARRAYS}
        old, versions = data["old_logp"], data.get("versions")
        token_versions = data.get("token_version")  # none in checkpoints before it
        return cls(
            group_size=int(data["group_size"]),
            prompts=tuple(Prompt(p["text"], p["fields"]) for p in data["prompts"]),
            texts=tuple(data["texts"]),
            reward_scores={k: np.asarray(v, np.float32) for k, v in data["reward_scores"].items()},
            old_logp=None if old is None else np.asarray(old, np.float32),
            token_version=None if token_versions is None else np.asarray(token_versions, np.int32),
            routing=None if data.get("routing") is None else np.asarray(data["routing"], np.int32),
            row_fields={k: tuple(v) for k, v in data.get("row_fields", {}).items()},
            versions=None if versions is None else np.asarray(versions, np.int32),
            segments=None if data.get("segments") is None else Segments.from_json(data["segments"]),
            info=dict(data.get("info", {})),
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


def version_lag_metrics(token_version: np.ndarray, mask: np.ndarray, current: int) -> dict[str, float]:
    """How many steps older than the `current` weights (step count) the weights that sampled each
    real token (`mask` > 0) are: the token-weighted mean and the max of `current - token_version`,
    and the fraction of tokens at lag 0 (sampled by the weights that train on them: partial
    rollouts' tokens after a switch)."""
    lag = (current - token_version.astype(np.int64))[mask > 0]
    if not lag.size:
        return {}
    return {"rollout/staleness_token_lag_mean": float(lag.mean()), "rollout/staleness_token_lag_max": float(lag.max()),
            "rollout/staleness_current_frac": float((lag == 0).mean())}


def concat(parts: Sequence[Groups], *, pad_id: int) -> Groups:
    """Groups of several rounds in order; prompts re-padded on the left to a common width.

    Rows of a part without recorded behaviour log-probs get NaN rows when another part has them,
    and version -1 (unknown) when another part records its versions.
    """
    if len(parts) == 1:
        return parts[0]
    width = max(p.prompt_tokens.shape[1] for p in parts)
    names = list(parts[0].reward_scores)
    if any(list(p.reward_scores) != names for p in parts):
        raise ValueError(f"cannot concatenate groups scored by different reward functions: "
                         f"{[list(p.reward_scores) for p in parts]}")

    def widen(x: np.ndarray, fill: float) -> np.ndarray:
        return np.pad(x, ((0, 0), (width - x.shape[1], 0)), constant_values=fill)

    arrays = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _ROW_ARRAYS if "prompt" not in name}
    old_logp = None
    if any(p.old_logp is not None for p in parts):
        old_logp = np.concatenate(
            [p.old_logp if p.old_logp is not None else np.full(p.completion_mask.shape, np.nan, np.float32)
             for p in parts]
        )
    versions = None
    if any(p.versions is not None for p in parts):
        versions = np.concatenate([p.versions if p.versions is not None else np.full(len(p.rewards), -1, np.int32)
                                   for p in parts])
    token_versions = [p.token_version for p in parts]
    routings = [p.routing for p in parts]
    if any(r is not None for r in routings) and any(r is None for r in routings):
        raise ValueError("cannot concatenate groups with and without a recorded routing (routing replay)")
    return Groups(
        group_size=parts[0].group_size,
        prompts=tuple(q for p in parts for q in p.prompts),
        prompt_tokens=np.concatenate([widen(p.prompt_tokens, pad_id) for p in parts]),
        prompt_mask=np.concatenate([widen(p.prompt_mask, 0.0) for p in parts]),
        texts=tuple(t for p in parts for t in p.texts),
        reward_scores={k: np.concatenate([p.reward_scores[k] for p in parts]) for k in names},
        old_logp=old_logp,
        versions=versions,
        # versions of every part, or none (a part without them: the rows' versions are unknown)
        token_version=None if any(v is None for v in token_versions) else np.concatenate(token_versions),
        routing=None if routings[0] is None else np.concatenate(routings),
        row_fields={k: tuple(x for p in parts for x in p.row_fields[k]) for k in parts[0].row_fields},
        segments=concat_segments([p.segments for p in parts], [len(p.rewards) for p in parts], pad_id=pad_id),
        **arrays,
    )
