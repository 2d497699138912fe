"""Where a run's metrics go besides metrics.jsonl (`TrainingConfig.loggers`).

A sink receives each logged step's metrics, each step's completion samples
and the run's resolved config. TensorBoard is built into `MetricsLogger`
(scalars, plus the config and samples as text); Weights & Biases, MLflow
(rl_core.run.mlflow_sink) and trackio (rl_core.run.trackio_sink) are optional
extras (`pip install 'rl-core[wandb]'`, `[mlflow]`, `[trackio]`), imported only
when a run asks for them. W&B honours the usual `WANDB_*` variables
(`WANDB_MODE=offline` writes the run under `<run folder>/wandb/` without a network).
Every sink's samples table has the same columns (rl_core.run.sink_values.sample_table), and
the console table (rl_core.run.console_samples) shows the same fields.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rl_core.config import ConfigError
from rl_core.run.sink_values import sample_table, scalars

class MetricsSink(Protocol):
    def write(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def write_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None: ...

    def close(self) -> None: ...


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
