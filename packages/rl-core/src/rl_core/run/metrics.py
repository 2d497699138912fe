"""Metrics: JSONL plus TensorBoard event files (the console progress bar is `rl_core.run.progress`)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl_core.run.files import append_text, keep_records_through
from rl_core.run.layout import METRICS, TENSORBOARD
from rl_core.run.tb_events import EventWriter, truncate_events


class MetricsLogger:
    """Writes one JSON object per logged step to `metrics.jsonl` and TensorBoard.

    `history` keeps every logged record in memory as well. On resume,
    `truncate_after(step)` drops records a crashed run wrote past its last
    checkpoint (and a line or event torn by a kill), so the files read as one
    uninterrupted run.
    """

    def __init__(self, output_dir: str | Path | None, *, tensorboard: bool = True) -> None:
        self.history: list[dict[str, Any]] = []
        self.path = None
        self._tb = None
        self._tb_dir = None
        if output_dir is not None:
            out = Path(output_dir)
            out.mkdir(parents=True, exist_ok=True)
            self.path = out / METRICS
            if tensorboard:
                self._tb_dir = out / TENSORBOARD
                # the pid keeps a resumed process from reopening (emptying) the file of the one before
                self._tb = EventWriter(self._tb_dir, filename_suffix=f".{os.getpid()}")

    def truncate_after(self, step: int) -> None:
        """Keep the records (JSONL and TensorBoard) of steps <= `step`; a torn last line is dropped."""
        if self.path is None:
            return
        self.history = keep_records_through(self.path, step)
        if self._tb_dir is not None:
            truncate_events(self._tb_dir, step)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in sorted(metrics.items())}}
        self.history.append(record)
        if self.path is not None:
            append_text(self.path, json.dumps(record) + "\n", step=step)
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.scalar(key, value, step)
            self._tb.flush(step)

    def write_text(self, tag: str, text: str, step: int) -> None:
        """A Markdown text summary in TensorBoard (its TEXT tab); nothing without TensorBoard."""
        if self._tb is not None:
            self._tb.text(tag, text, step)
            self._tb.flush(step)

    def close(self) -> None:
        if self._tb is not None:
            tb, self._tb = self._tb, None  # closed once, even when its last flush fails
            tb.close()


def _plain(value: Any) -> Any:
    """JSON-friendly Python scalars (numpy and jax scalars become float/int)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN; keep it visible rather than dropping it
    return value
