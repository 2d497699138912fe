"""`training.loggers=[mlflow]`: scalars, the resolved config and a samples table per step, to MLflow.

MLflow's tracking client alone is needed (`pip install 'rl-core[mlflow]'`: mlflow-skinny, no
server or UI). The run goes where `MLFLOW_TRACKING_URI` says (a tracking server, a database);
without it, to a file store in `<run folder>/mlruns` (open it with `mlflow ui --backend-store-uri
<run folder>/mlruns`). MLflow keeps its file store in maintenance mode and refuses it unless
`MLFLOW_ALLOW_FILE_STORE` is true; choosing that default here sets it for this process, unless the
user set it. `MLFLOW_EXPERIMENT_NAME` names the experiment (default `rl-variants`).

Metric names keep their slashes; characters MLflow refuses (`@` in `eval/pass@1`) become `_`
(`mlflow_key`). Each step's samples are an artifact `samples/step-<n>.json` in the layout of
MLflow's own tables (`{"columns": [...], "data": [[...]]}`, pandas' "split" orientation, which
`mlflow.load_table` reads).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_core.config import ConfigError
from rl_core.run.sink_values import sample_table, scalars

EXPERIMENT = "rl-variants"
STORE = "mlruns"
"""The file store's folder in the run folder, when MLFLOW_TRACKING_URI is not set."""
MAX_PARAM_CHARS = 6000
"""MLflow's limit on a parameter's value; longer values are cut (config.json keeps them whole)."""
_REFUSED = re.compile(r"[^/\w.\- :]")  # MLflow's rule for metric and parameter names (POSIX)


def mlflow_key(key: str) -> str:
    """`key` as MLflow accepts it: `eval/pass@1` -> `eval/pass_1`."""
    return _REFUSED.sub("_", key)


def samples_artifact(step: int) -> str:
    return f"samples/step-{step:08d}.json"


def flat_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"training": {"num_steps": 2}} -> {"training.num_steps": "2"}: a config as MLflow parameters."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out |= flat_params(value, f"{prefix}{key}.")
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[mlflow_key(f"{prefix}{key}")] = text[:MAX_PARAM_CHARS]
    return out


class MlflowSink:
    """One MLflow run: metrics at each logged step, the config as parameters (and config.json),
    each step's samples as a table artifact."""

    def __init__(self, output_dir: Path, *, config: Mapping[str, Any], name: str) -> None:
        try:
            from mlflow import MlflowClient  # the package first: its submodules may be loaded without it
            from mlflow.entities import Metric, Param
            from mlflow.exceptions import MlflowException
        except ImportError:
            raise ConfigError(
                "TrainingConfig.loggers includes 'mlflow', but mlflow is not installed: install the extra "
                "(`pip install 'trainer[mlflow]'` or `'rl-core[mlflow]'`; in the rl-variants workspace, `uv sync`)"
            ) from None
        self._metric = Metric
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (Path(output_dir) / STORE).absolute().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # see the module's docstring
        try:
            self.client = MlflowClient(tracking_uri=uri)
            experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", EXPERIMENT)
            experiment = self.client.get_experiment_by_name(experiment_name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(experiment_name)
            self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
            params = [Param(k, v) for k, v in flat_params(config).items()]
            for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
                self.client.log_batch(self.run_id, params=params[start : start + 100])
            self.client.log_dict(self.run_id, dict(config), "config.json")
        except MlflowException as e:
            raise ConfigError(f"TrainingConfig.loggers includes 'mlflow', and MLflow at {uri} refused: {e.message}") from None
        self.uri = uri

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        now = int(time.time() * 1000)
        batch = [self._metric(mlflow_key(k), v, now, step) for k, v in scalars(metrics).items()]
        for start in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics a call
            self.client.log_batch(self.run_id, metrics=batch[start : start + 1000])

    def write_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        columns, rows = sample_table(step, samples)
        self.client.log_dict(self.run_id, {"columns": columns, "data": rows}, samples_artifact(step))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
