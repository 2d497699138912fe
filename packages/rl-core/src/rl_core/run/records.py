"""A run's records read back through its layout: what `trainer show` and `trainer samples` view,
and what `replay` sends to a sink (rl_core.run.sinks) after the fact.

A running run is read as it is: a last line torn mid-write is left out (rl_core.run.files). A run
folder at a URL (gs://bucket/run, any fsspec filesystem) is read from a local copy of its record
files alone (`layout.RECORDS`), without its checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rl_core.run import storage
from rl_core.run.files import read_jsonl
from rl_core.run.layout import CONFIG, EVAL_BEFORE, METRICS, RECORDS, SAMPLES, SUMMARY
from rl_core.run.sinks import MetricsSink


@dataclasses.dataclass(frozen=True)
class RunRecords:
    """The records of the run folder `folder` (a local one)."""

    folder: Path

    def metrics(self) -> list[dict[str, Any]]:
        """metrics.jsonl: one record per logged step."""
        return read_jsonl(self.folder / METRICS)[0]

    def samples(self) -> list[dict[str, Any]]:
        """samples.jsonl: `training.samples_per_step` completions of each step."""
        return read_jsonl(self.folder / SAMPLES)[0]

    def summary(self) -> dict[str, Any] | None:
        """summary.json, written when the run ended (None while it runs, or if it was killed)."""
        return self._json(SUMMARY)

    def eval_before(self) -> dict[str, Any] | None:
        """eval_before.json: the held-out evaluation of the policy RL started from."""
        return self._json(EVAL_BEFORE)

    def _json(self, name: str) -> dict[str, Any] | None:
        path = self.folder / name
        return json.loads(path.read_text()) if path.exists() else None


@contextlib.contextmanager
def open_records(location: str | Path) -> Iterator[RunRecords]:
    """The records of the run folder at `location`: a local path, or a URL whose record files are
    copied into a temporary folder (removed afterwards). A place without config.yaml is no run folder."""
    if not storage.is_url(location):
        folder = Path(location)
        if not (folder / CONFIG).is_file():
            raise FileNotFoundError(2, "not a run folder (config.yaml is missing)", str(folder))
        yield RunRecords(folder)
        return
    fs, root = storage.filesystem(location)
    root = root.rstrip("/")
    if not fs.isfile(f"{root}/{CONFIG}"):
        raise FileNotFoundError(2, "not a run folder (config.yaml is missing)", location)
    with tempfile.TemporaryDirectory(prefix="run-records-") as tmp:
        for name in RECORDS:
            if fs.isfile(f"{root}/{name}"):
                fs.get(f"{root}/{name}", str(Path(tmp) / name))
        yield RunRecords(Path(tmp))


def replay(records: RunRecords, sink: MetricsSink) -> None:
    """Send a run's metrics and samples to `sink` step by step, as the recorder did while it ran
    (e.g. a finished run into a tracker it did not log to)."""
    samples: dict[int, list[dict[str, Any]]] = {}
    for sample in records.samples():
        samples.setdefault(sample["step"], []).append({k: v for k, v in sample.items() if k != "step"})
    metrics = {record["step"]: record for record in records.metrics()}
    for step in sorted(set(metrics) | set(samples)):
        if step in metrics:
            sink.write(step, {k: v for k, v in metrics[step].items() if k != "step"})
        if step in samples:
            sink.write_samples(step, samples[step])
