"""Weights published to a rollout in progress (partial rollouts, `rollout.partial_rollouts`).

A `WeightFeed` holds the newest (version, weights) another thread published; the paged engine
reads it between device calls (`PagedBackend.follow_feed`) and, when it holds a version newer
than the engine's, decodes the following calls with it. So a rollout that started under the
weights of step n-1 finishes under those of step n once the update publishes them, as PipelineRL
(arXiv:2509.19128) and NeMo RL's in-flight weight updates do. Every token keeps the version that
sampled it and its log-prob under that version (`Completions.token_version`).

The weights are what `RolloutBackend.update_weights` takes (the whole policy's parameters); the
engine makes its inference copy when it switches, on its own thread. The publisher must keep
them alive (not donated) until the rollout ends: the learner publishes W(n) after update n and
donates it only in update n+1, after it has waited for the collection.
"""

from __future__ import annotations

import threading
from typing import Any


class WeightFeed:
    """The newest weights published, read between device calls; safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: tuple[int, Any] | None = None

    def publish(self, version: int, weights: Any) -> None:
        """Make `weights` the newest, as `version`; an older or equal version than one already
        published is a ValueError (versions are step counts: they only grow)."""
        with self._lock:
            if self._latest is not None and version <= self._latest[0]:
                raise ValueError(f"published weight version {version} after version {self._latest[0]}: "
                                 f"versions must grow")
            self._latest = (int(version), weights)

    def newer_than(self, version: int) -> tuple[int, Any] | None:
        """(version, weights) when the newest published version is newer than `version`, else None."""
        with self._lock:
            latest = self._latest
        return latest if latest is not None and latest[0] > version else None

    def forget_through(self, version: int) -> None:
        """Drop published weights no newer than `version` (the engine holds those or newer), so
        the feed keeps no reference to a buffer the publisher may donate later."""
        with self._lock:
            if self._latest is not None and self._latest[0] <= version:
                self._latest = None

    @property
    def version(self) -> int | None:
        """The newest published version (None when nothing is held)."""
        with self._lock:
            return None if self._latest is None else self._latest[0]


__all__ = ["WeightFeed"]
