"""Orbax checkpoints of the whole training state, for exact resume.

A checkpoint holds params, optimizer state and the PRNG key as arrays, and a
JSON record of the step, the data position and whatever the algorithm adds
(`RLLearner.extra_state`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    def __init__(self, directory: str | Path, *, max_to_keep: int = 2) -> None:
        self.directory = Path(directory).absolute()
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, *, arrays: Any, meta: dict[str, Any]) -> None:
        """Save and wait: a checkpoint that exists on disk is complete."""
        self._manager.save(
            step,
            args=ocp.args.Composite(arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)),
            force=True,
        )
        self._manager.wait_until_finished()

    def restore(self, step: int, *, like: Any) -> tuple[Any, dict[str, Any]]:
        """(arrays shaped and sharded like `like`, meta) of checkpoint `step`."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(arrays=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
        )
        return restored["arrays"], dict(restored["meta"])

    def close(self) -> None:
        self._manager.close()
