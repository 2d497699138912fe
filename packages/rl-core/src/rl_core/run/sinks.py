"""Where a run's metrics go besides metrics.jsonl (`TrainingConfig.loggers`).

A sink receives each logged step's metrics, each step's completion samples
and the run's resolved config. TensorBoard is built into `MetricsLogger`
(scalars, plus the config and samples as text); Weights & Biases is an
optional extra (`pip install 'rl-core[wandb]'`), imported only when a run asks
for it, and honours the usual `WANDB_*` variables (`WANDB_MODE=offline`
writes the run under `<run folder>/wandb/` without a network).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rl_core.config import ConfigError
SAMPLE_COLUMNS = ("step", "id", "prompt", "completion", "reward", "advantage")
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


def samples_markdown(samples: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table of samples (TensorBoard renders text summaries as Markdown)."""

    def cell(value: Any) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        text = text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."
        return text.replace("|", "\\|").replace("\n", "⏎")

    lines = ["| " + " | ".join(SAMPLE_COLUMNS[1:]) + " |", "|" + "---|" * (len(SAMPLE_COLUMNS) - 1)]
    lines += ["| " + " | ".join(cell(s.get(c, "")) for c in SAMPLE_COLUMNS[1:]) + " |" for s in samples]
    return "\n".join(lines)


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
        rows = [[step if c == "step" else s.get(c) for c in SAMPLE_COLUMNS] for s in samples]
        self.run.log({"samples": self._wandb.Table(columns=list(SAMPLE_COLUMNS), data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()
