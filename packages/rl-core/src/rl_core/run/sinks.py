"""Where a run's metrics go besides metrics.jsonl (`TrainingConfig.loggers`).

A sink receives each logged step's metrics, each step's completion samples
and the run's resolved config. TensorBoard is built into `MetricsLogger`
(scalars, plus the config and samples as text); Weights & Biases, MLflow
(rl_core.run.mlflow_sink) and trackio (rl_core.run.trackio_sink) are optional
extras (`pip install 'rl-core[wandb]'`, `[mlflow]`, `[trackio]`), imported only
when a run asks for them. W&B honours the usual `WANDB_*` variables
(`WANDB_MODE=offline` writes the run under `<run folder>/wandb/` without a network).
Every sink's samples table has the same columns (`sample_table`), and the console
table (rl_core.run.console_samples) shows the same fields.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rl_core.config import ConfigError
SAMPLE_COLUMNS = ("step", "id", "prompt", "completion", "length", "reward", "advantage")
"""A samples table's first columns; one `reward/<function>` column per reward function follows."""
SHOWN_CHARS = 300
"""Longest prompt or completion shown in a TensorBoard text table (the JSONL keeps them whole)."""


class MetricsSink(Protocol):
    def write(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def write_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None: ...

    def close(self) -> None: ...


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics record (no step, no strings)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def reward_functions(samples: Sequence[Mapping[str, Any]]) -> list[str]:
    """The reward functions the samples were scored with (their `rewards`), in order of appearance."""
    return list(dict.fromkeys(name for s in samples for name in s.get("rewards", {})))


def sample_table(step: int, samples: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows) of one step's samples: SAMPLE_COLUMNS, then each reward function's score
    as `reward/<name>` (None where a sample lacks one, e.g. a record from before they were kept)."""
    functions = reward_functions(samples)
    columns = [*SAMPLE_COLUMNS, *(f"reward/{name}" for name in functions)]
    rows = [
        [step if c == "step" else s.get(c) for c in SAMPLE_COLUMNS] + [s.get("rewards", {}).get(n) for n in functions]
        for s in samples
    ]
    return columns, rows


def samples_markdown(samples: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table of samples (TensorBoard renders text summaries as Markdown)."""

    def cell(value: Any) -> str:
        text = "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
        text = text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."
        return text.replace("|", "\\|").replace("\n", "⏎")

    columns, rows = sample_table(0, samples)
    lines = ["| " + " | ".join(columns[1:]) + " |", "|" + "---|" * (len(columns) - 1)]
    lines += ["| " + " | ".join(cell(v) for v in row[1:]) + " |" for row in rows]
    return "\n".join(lines)


def open_sinks(loggers: Sequence[str], output_dir: Path, *, config: Mapping[str, Any], name: str) -> list[MetricsSink]:
    """The sinks `loggers` names besides TensorBoard (which `MetricsLogger` writes itself), each
    imported only when asked for; `name` names the run in the tracker."""
    sinks: list[MetricsSink] = []
    try:
        if "wandb" in loggers:
            sinks.append(WandbSink(output_dir, config=config, name=name))
        if "mlflow" in loggers:
            from rl_core.run.mlflow_sink import MlflowSink

            sinks.append(MlflowSink(output_dir, config=config, name=name))
        if "trackio" in loggers:
            from rl_core.run.trackio_sink import TrackioSink

            sinks.append(TrackioSink(config=config, name=name))
    except BaseException:
        for sink in sinks:  # one that failed to open leaves none of the others running
            sink.close()
        raise
    return sinks


class WandbSink:
    """Scalars, the resolved config and a table of completion samples per step, to Weights & Biases."""

    def __init__(self, output_dir: Path | None, *, config: Mapping[str, Any], name: str | None = None) -> None:
        try:
            import wandb
        except ImportError:
            raise ConfigError(
                "TrainingConfig.loggers includes 'wandb', but wandb is not installed: "
                "install the extra (`pip install 'trainer[wandb]'` or `'rl-core[wandb]'`; "
                "in the rl-variants workspace, `uv sync` with the dev group)"
            ) from None
        self._wandb = wandb
        if output_dir is not None:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "rl-variants"),
            name=name,
            dir=None if output_dir is None else str(output_dir),
            config=dict(config),
        )

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log(scalars(metrics), step=step)

    def write_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        columns, rows = sample_table(step, samples)
        self.run.log({"samples": self._wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()
