"""What the pipeline reports of the groups a step trains on, as functions of values: the
step's metrics of the rewards, advantages and lengths (`group_metrics`), of what the
collection cost (`collection_metrics`), and one sample record per completion (`samples`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rl_core.episodes import EpisodeRecord, episode_metrics
from rl_core.learner.groups import TOTAL, Groups, version_lag_metrics


def group_metrics(groups: Groups, advantages: np.ndarray) -> dict[str, float]:
    """Metrics of the groups trained on (every reward function's over the same rows)."""
    lengths = groups.lengths.astype(np.float64)
    metrics = {}
    for name, scores in groups.reward_scores.items():
        metrics[f"rewards/{name}/mean"] = float(scores.mean())
        metrics[f"rewards/{name}/frac_positive"] = float((scores > 0).mean())
    metrics.update(
        {
            "rewards/total/mean": float(groups.rewards.mean()),
            "rewards/total/std": float(groups.rewards.std()),
            "rewards/failed": float(groups.info.get("rewards/failed", 0.0)),
            "groups/uniform_frac": float(groups.uniform(TOTAL).mean()),
            "advantages/mean": float(advantages.mean()),
            "advantages/std": float(advantages.std()),
            "completions/length_mean": float(lengths.mean()),
            "completions/length_min": float(lengths.min()),
            "completions/length_max": float(lengths.max()),
            "completions/truncated_frac": float(groups.truncated.mean()),
        }
    )
    if "episode" in groups.row_fields:
        metrics.update(episode_metrics([EpisodeRecord.from_json(e) for e in groups.row_fields["episode"]]))
    return metrics


def collection_metrics(groups: Groups, *, step: int) -> dict[str, float]:
    """What collecting `groups` cost and which weights sampled them (trained at step count `step`)."""
    metrics: dict[str, float] = {}
    if groups.token_version is not None:  # per token: partial rollouts mix versions within a row
        metrics.update(version_lag_metrics(groups.token_version, groups.completion_mask, step))
    # generated: what the backend decoded (padding rows and a turn's tokens past where its episode
    # cut it included); kept: the model tokens the completions hold (episodes' turns as cut)
    tokens = groups.info.get("perf/generated_tokens", 0.0)
    kept = groups.info.get("perf/kept_tokens", tokens)
    metrics["perf/generated_tokens"] = tokens
    metrics["perf/kept_tokens"] = kept
    metrics["perf/decoded_per_kept"] = tokens / kept if kept else 1.0
    # prompt tokens the engine prefilled, and those it continued from an episode's retained sequence
    metrics |= {k: v for k, v in groups.info.items() if k in ("perf/prefill_tokens", "perf/reused_prefix_tokens")}
    if groups.segments is not None:  # rows beyond the episodes': rewritten histories' earlier segments
        metrics["episodes/earlier_segments"] = float(len(groups.segments))
    if groups.versions is not None:  # the weights that sampled the rows (carried groups: older ones)
        metrics["rollout/version_min"] = float(groups.versions.min())
        metrics["rollout/version_max"] = float(groups.versions.max())
    return metrics


def samples(groups: Groups, advantages: np.ndarray, ids: Sequence[str]) -> list[dict[str, Any]]:
    """One record per completion (samples.jsonl), with id `ids[i]`."""
    g = groups.group_size
    out = [
        {
            "id": ids[i],
            "prompt": groups.prompts[i // g].text,
            "completion": groups.texts[i],
            "reward": float(groups.rewards[i]),
            "advantage": float(advantages[i]),
            "length": int(groups.lengths[i]),  # tokens, with EOS
            # each reward function's own (unweighted) score: what the console table and trackers show
            "rewards": {name: float(scores[i]) for name, scores in groups.reward_scores.items()},
        }
        for i in range(len(groups.texts))
    ]
    # the weights' step count that sampled the row (with partial rollouts: its first tokens)
    if groups.versions is not None:
        for sample, version in zip(out, groups.versions.tolist(), strict=True):
            sample["version"] = version
    for sample, episode in zip(out, groups.row_fields.get("episode", ()), strict=False):
        # every turn with its role; the completion column shows the whole episode
        record = EpisodeRecord.from_json(episode)
        sample.update(completion=record.transcript(), turns=episode["turns"], turn_rewards=list(record.rewards))
    return out


def audit_inputs(groups: Groups, weights: Mapping[str, float]) -> dict[str, Any]:
    """What a reward audit (rl_core.learner.reward_audit) is told of the groups, but the step."""
    return dict(total=groups.rewards.tolist(), weights=dict(weights), group_size=groups.group_size,
                per_function={name: scores.tolist() for name, scores in groups.reward_scores.items()},
                lengths=groups.lengths.tolist(), finished=(~groups.truncated).tolist())
