"""`training.loggers=[trackio]`: scalars, the resolved config and a samples table per step, to trackio.

trackio (`pip install 'rl-core[trackio]'`) keeps runs in a local SQLite database, under
`TRACKIO_DIR` (default `~/.cache/huggingface/trackio`), one file per project; `trackio show`
opens its dashboard. Its own variables apply (`TRACKIO_SPACE_ID` logs to a Hugging Face Space
instead); `TRACKIO_PROJECT` names the project here (default `rl-variants`). The run is named like
the run folder. Each step's samples are a `trackio.Table` logged as `samples`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from rl_core.config import ConfigError
from rl_core.run.sink_values import sample_table, scalars

PROJECT = "rl-variants"


class TrackioSink:
    """One trackio run: metrics at each logged step, the config, a samples table per step."""

    def __init__(self, *, config: Mapping[str, Any], name: str) -> None:
        try:
            import trackio
        except ImportError:
            raise ConfigError(
                "TrainingConfig.loggers includes 'trackio', but trackio is not installed: install the extra "
                "(`pip install 'trainer[trackio]'` or `'rl-core[trackio]'`; in the rl-variants workspace, `uv sync`)"
            ) from None
        self._trackio = trackio
        self.project = os.environ.get("TRACKIO_PROJECT", PROJECT)
        # no CPU or GPU sampling thread: the run's own metrics are what this sink is for
        self.run = trackio.init(project=self.project, name=name, config=dict(config), embed=False,
                                auto_log_cpu=False, auto_log_gpu=False)

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log(scalars(metrics), step=step)

    def write_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        columns, rows = sample_table(step, samples)
        self.run.log({"samples": self._trackio.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        from trackio import context_vars

        if context_vars.current_run.get() is self.run:  # trackio's current run: finished and forgotten
            self._trackio.finish()
        else:
            self.run.finish()
