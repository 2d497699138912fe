"""The MLflow and trackio sinks against the real libraries, each writing to a local store (MLflow's
file store, trackio's SQLite database) and read back with the library's own reader.

A hand-written run folder's records are replayed into each sink (rl_core.run.records.replay, as
the recorder sends them while a run goes); what the tracker holds must equal them: every finite
metric at its step, the config, and each step's samples table. tests/trainer/test_trainer_watch.py
does the same for a real training run. Both are in the e2e tier (MLflow's import alone takes over a
second; trackio's test starts two processes).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rl_core.config import ConfigError
from rl_core.run.mlflow_sink import MlflowSink, flat_params, mlflow_key, samples_artifact
from rl_core.run.records import RunRecords, replay
from rl_core.run.sink_values import sample_table

CONFIG = {"algo": "grpo", "training": {"num_steps": 2, "loggers": ["mlflow"]}, "eval": {"pass_k": 1}}
METRICS = [
    {"step": 1, "rewards/total/mean": 0.25, "eval/pass@1": 0.5, "train/kl": 0.0, "note": "text is no metric",
     "train/loss": "nan"},  # JSON keeps a NaN as a string: not a metric either
    {"step": 2, "rewards/total/mean": 0.75, "train/kl": 0.125},
]  # fmt: skip
SAMPLES = [
    {"step": 1, "id": "step1/prompt0/sample0", "prompt": "2+2=", "completion": "4", "reward": 1.0, "advantage": 0.5,
     "length": 2, "rewards": {"numeric_answer": 1.0}},
    {"step": 1, "id": "step1/prompt0/sample1", "prompt": "2+2=", "completion": "5", "reward": 0.0, "advantage": -0.5,
     "length": 2, "rewards": {"numeric_answer": 0.0}},
    {"step": 2, "id": "step2/prompt0/sample0", "prompt": "3+4=", "completion": "7", "reward": 1.0, "advantage": 0.0,
     "length": 2, "rewards": {"numeric_answer": 1.0}},
]  # fmt: skip
EXPECTED = {(1, "rewards/total/mean"): 0.25, (1, "eval/pass@1"): 0.5, (1, "train/kl"): 0.0,
            (2, "rewards/total/mean"): 0.75, (2, "train/kl"): 0.125}  # fmt: skip


@pytest.fixture
def records(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in METRICS))
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in SAMPLES))
    return RunRecords(folder)


def tables_by_step():
    return {step: sample_table(step, [s for s in SAMPLES if s["step"] == step]) for step in (1, 2)}


@pytest.mark.e2e  # importing MLflow alone takes over a second
def test_mlflow_file_store_holds_metrics_config_and_samples_tables(records, monkeypatch):
    from mlflow.tracking import MlflowClient

    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):  # unset here, and as they were afterwards
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    # the sink picks a file store in the run folder and allows it (MLflow refuses one otherwise)
    sink = MlflowSink(records.folder, config=CONFIG, name="runs/run")
    replay(records, sink)
    sink.close()
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"

    client = MlflowClient(tracking_uri=(records.folder / "mlruns").as_uri())
    run = client.get_run(sink.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "runs/run"
    assert run.data.params == {"algo": "grpo", "training.num_steps": "2", "training.loggers": '["mlflow"]',
                               "eval.pass_k": "1"}  # fmt: skip
    stored = {(m.step, key): m.value for key in run.data.metrics for m in client.get_metric_history(sink.run_id, key)}
    assert stored == {(step, mlflow_key(key)): value for (step, key), value in EXPECTED.items()}
    assert mlflow_key("eval/pass@1") == "eval/pass_1"  # MLflow refuses '@'
    local = client.download_artifacts(sink.run_id, "", str(records.folder / "read-back"))
    assert json.loads((records.folder / "read-back" / "config.json").read_text()) == CONFIG
    for step, (columns, rows) in tables_by_step().items():
        table = json.loads((Path(local) / samples_artifact(step)).read_text())
        assert table == {"columns": columns, "data": rows}
    assert tables_by_step()[1][0][-1] == "reward/numeric_answer"


def test_mlflow_params_are_cut_to_mlflows_limit():
    params = flat_params({"a": {"b": "x" * 7000, "c@d": [1, 2]}})
    assert params == {"a.b": "x" * 6000, "a.c_d": "[1, 2]"}


TRACKIO_READER = textwrap.dedent("""
    import json, sys
    from trackio.sqlite_storage import SQLiteStorage
    logs = SQLiteStorage.get_logs("rl-variants", sys.argv[1])
    config = SQLiteStorage.get_run_config("rl-variants", sys.argv[1])
    print(json.dumps({"logs": logs, "config": config}, default=str))
""")


@pytest.mark.e2e  # two processes
def test_trackio_database_holds_metrics_config_and_samples_tables(records, tmp_path):
    # trackio reads TRACKIO_DIR once, when imported: the sink and the reader each run in a process of their own
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}
    writer = textwrap.dedent(f"""
        from pathlib import Path
        from rl_core.run.records import RunRecords, replay
        from rl_core.run.trackio_sink import TrackioSink
        sink = TrackioSink(config={CONFIG!r}, name="runs/run")
        replay(RunRecords(Path({str(records.folder)!r})), sink)
        sink.close()
    """)
    subprocess.run([sys.executable, "-c", writer], env=env, check=True, capture_output=True)
    read = subprocess.run([sys.executable, "-c", TRACKIO_READER, "runs/run"], env=env, check=True, capture_output=True)
    stored = json.loads(read.stdout)
    assert {k: v for k, v in stored["config"].items() if not k.startswith("_")} == CONFIG
    logs = stored["logs"]
    scalars = {(log["step"], k): v for log in logs for k, v in log.items()
               if k not in ("step", "timestamp", "samples")}  # fmt: skip
    assert scalars == EXPECTED
    tables = {log["step"]: log["samples"] for log in logs if "samples" in log}
    for step, (columns, rows) in tables_by_step().items():
        assert tables[step]["_type"] == "trackio.table"
        assert tables[step]["_value"] == [dict(zip(columns, row, strict=True)) for row in rows]


@pytest.mark.parametrize("module, message", [
    ("mlflow", r"loggers includes 'mlflow', but mlflow is not installed: .*pip install 'trainer\[mlflow\]'"),
    ("trackio", r"loggers includes 'trackio', but trackio is not installed: .*pip install 'trainer\[trackio\]'"),
])  # fmt: skip
def test_a_missing_extra_is_a_clear_error(module, message, monkeypatch, tmp_path):
    from rl_core.run.sinks import open_sinks

    monkeypatch.setitem(sys.modules, module, None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=message):
        open_sinks([module], tmp_path, config={}, name="run")
