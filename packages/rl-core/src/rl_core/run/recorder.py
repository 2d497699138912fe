"""The run recorder: where a run's records go, and where a resumed run finds them.

It writes each logged step's metrics (metrics.jsonl, TensorBoard scalars, Weights &
Biases, MLflow, trackio), a few completions per step (samples.jsonl, the sinks' tables and,
every few steps, a table on the console: rl_core.run.console_samples), the
run's resolved settings as a text summary, and Orbax checkpoints of whatever arrays
and JSON record the learner hands it. On resume it restores the newest checkpoint
that restores and cuts every record file back to that step, so each step appears
once. Without a run folder it keeps metrics in memory only and cannot checkpoint.

In a multi-process run only process 0 writes records (`writes`); every process
saves and restores its own checkpoint shards.

The run folder may be a URL (gs://bucket/run, any fsspec filesystem): the recorder then
works in a local copy pulled from it and pushes the copy back once each checkpoint is
complete and when it closes (see rl_core.run.storage). A caller that writes files of its own
into the run folder (the trainer) opens the `StagedFolder` itself and passes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_core.run.checkpoint import Checkpointer
from rl_core.config import TrainingConfig
from rl_core.run.files import append_text, keep_records_through
from rl_core.run.metrics import MetricsLogger
from rl_core.run.layout import CHECKPOINTS, SAMPLES
from rl_core.run.console_samples import ConsoleSamples
from rl_core.run.sink_values import samples_markdown
from rl_core.run.sinks import MetricsSink, open_sinks
from rl_core.run.storage import StagedFolder, is_url, open_staged


class RunRecorder:
    """Metrics, samples, settings summary and checkpoints of one run folder (or none)."""

    def __init__(self, output_dir: str | Path | StagedFolder | None, *, training: TrainingConfig,
                 run_config: Mapping[str, Any], writes: bool, progress: bool = False) -> None:
        """`output_dir`: a local folder, a URL (pulled into a local copy here, removed at `close`),
        a StagedFolder its caller pulled and will close, or None (no files, no checkpoints).
        `progress`: the run shows a progress bar (`training.console_samples='auto'` shows samples then)."""
        self.mirror = output_dir if isinstance(output_dir, StagedFolder) else None
        self._owns_mirror = is_url(output_dir)
        if self._owns_mirror:
            self.mirror = open_staged(output_dir)
        out = self.mirror.local if self.mirror else Path(output_dir) if output_dir is not None else None
        self.output_dir = out
        """The local run folder (with a URL, the local copy)."""
        self.writes = writes
        self.samples_per_step = training.samples_per_step
        self.logger = MetricsLogger(out if writes else None, tensorboard="tensorboard" in training.loggers)
        self.logger.write_text("config", "```\n" + json.dumps(dict(run_config), indent=2) + "\n```", 0)
        self.sinks: list[MetricsSink] = []
        if out is not None and writes:  # a learner without a run folder logs nowhere
            where = self.mirror.url.rstrip("/").split("/") if self.mirror else out.absolute().parts
            name = "/".join(where[-2:])  # the run folder and its parent, e.g. runs/grpo-20261204
            self.sinks = open_sinks(training.loggers, out, config=dict(run_config), name=name)
        if writes and ConsoleSamples.wanted(training.console_samples, progress=progress):
            self.sinks.append(ConsoleSamples(every_steps=training.console_samples_every_steps))
        self.checkpointer = (
            Checkpointer(out / CHECKPOINTS, max_to_keep=training.max_checkpoints_to_keep) if out else None
        )
        self._unpushed = False  # a save was started since the last push

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every metrics record logged (or, after a resume, kept) so far."""
        return self.logger.history

    def metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.logger.write(step, metrics)
        for sink in self.sinks:
            sink.write(step, metrics)

    def samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        """`training.samples_per_step` completions of the step (`spread` over its groups)."""
        shown = spread(samples, self.samples_per_step)
        if not shown or not self.writes:
            return
        if self.output_dir is not None:
            lines = "".join(json.dumps({"step": step, **sample}) + "\n" for sample in shown)
            append_text(self.output_dir / SAMPLES, lines, step=step)
        self.logger.write_text("samples", samples_markdown(shown), step)
        for sink in self.sinks:
            sink.write_samples(step, shown)

    # -- checkpoints -------------------------------------------------------------------------

    @property
    def can_checkpoint(self) -> bool:
        return self.checkpointer is not None

    def latest_checkpoint(self) -> int | None:
        return self.checkpointer.latest_step() if self.checkpointer else None

    def save(self, step: int, *, arrays: Any, meta: Mapping[str, Any]) -> None:
        """Start saving checkpoint `step` (written in the background; see rl_core.run.checkpoint)."""
        if self.checkpointer is None:
            raise ValueError("no output_dir: nowhere to save a checkpoint")
        self.wait()  # the save before, pushed to the URL before this one starts
        self.checkpointer.save(step, arrays=arrays, meta=dict(meta))
        self._unpushed = self.mirror is not None

    def wait(self) -> None:
        """Return once every checkpoint save started is on disk (and, with a URL, pushed there)."""
        if self.checkpointer is not None:
            self.checkpointer.wait()
            if self._unpushed:
                self.mirror.push()  # the checkpoint complete, the records through its step
                self._unpushed = False

    def restore(self, *, like: Any, log: Callable[[str], None] = print) -> tuple[Any, dict[str, Any]] | None:
        """(arrays shaped like `like`, meta) of the newest checkpoint that restores, or None.

        A damaged newer checkpoint is moved aside with one line in `log`. Records the killed
        run wrote past the restored step (metrics, samples, TensorBoard events, a line torn
        mid-write) are dropped, so each step is logged once.
        """
        if self.checkpointer is None:
            return None
        restored = self.checkpointer.restore_latest(like=like, log=log)
        if restored is None:
            return None
        _, arrays, meta = restored
        step = int(meta["step"])
        self.logger.truncate_after(step)
        if self.output_dir is not None and self.writes:
            keep_records_through(self.output_dir / SAMPLES, step)
        self.checkpointer.prune()
        return arrays, meta

    def close(self) -> None:
        """Finish the save in flight and close the files; with a URL, push everything there.
        Every part is closed even when one fails (a full disk); the first error is raised then."""
        errors = []

        def closing(close: Callable[[], Any]) -> None:
            try:
                close()
            except Exception as e:  # noqa: BLE001 - raised below, once the rest is closed
                errors.append(e)

        closing(self.logger.close)
        for sink in self.sinks:
            closing(sink.close)
        self.sinks = []
        if self.checkpointer is not None:
            closing(self.checkpointer.close)
        if errors:
            raise errors[0]  # with a URL, the local copy is kept, not pushed half-written
        if self.mirror is not None:
            self.mirror.push()
            if self._owns_mirror:
                self.mirror.close()
            self.mirror = None


def spread(samples: Sequence[Mapping[str, Any]], count: int) -> list[Mapping[str, Any]]:
    """`count` of a step's samples (rows group-contiguous): the first two of each group in turn
    (more when there are fewer groups than count / 2), so that a few prompts are seen, each with
    completions to contrast. Groups of two, or a count of every row, keep the rows as they are."""
    groups: list[list[Mapping[str, Any]]] = []
    for sample in samples:  # a group: consecutive rows of one prompt
        if groups and groups[-1][0].get("prompt") == sample.get("prompt"):
            groups[-1].append(sample)
        else:
            groups.append([sample])
    each = max(2, -(-count // max(len(groups), 1)))
    return [sample for group in groups for sample in group[:each]][:count]
