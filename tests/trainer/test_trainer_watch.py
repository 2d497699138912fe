"""Watching a run, end to end: a short `trainer train` (its own process, writing to a file as under
nohup) with the console samples table on and the MLflow and trackio sinks; then `trainer show`
and `trainer samples` on its folder; then what MLflow's file store and trackio's database hold,
read back with each library's own reader and compared with metrics.jsonl and samples.jsonl.
"""

import io
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from rl_core.run.mlflow_sink import mlflow_key, samples_artifact
from rl_core.run.sink_values import sample_table
from trainer.cli import main
from trainer.show import show_run
from trainer.show.curves import PANELS

pytestmark = pytest.mark.e2e

SETTINGS = [
    "training.num_steps=4", "warm_start.steps=0", "training.prompts_per_step=2", "algorithm.group_size=2",
    "eval.heldout_size=8", "eval.samples_per_prompt=2", "eval.pass_k=1", "eval.every_steps=2",
    "training.console_samples=always", "training.console_samples_every_steps=3",
    "training.loggers=[tensorboard,mlflow,trackio]",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    base = tmp_path_factory.mktemp("watch")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "TRACKIO_"))}
    env |= {"TRACKIO_DIR": str(base / "trackio"), "COLUMNS": "160"}  # the console table's width in a log file
    command = [sys.executable, "-m", "trainer.cli", "train", "--algo", "grpo", "--output", str(base / "run"),
               "--no-progress", *SETTINGS]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return base, done.stdout


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def finite_scalars(run) -> dict[tuple[int, str], float]:
    return {(r["step"], k): v for r in read_jsonl(run / "metrics.jsonl") for k, v in r.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}  # fmt: skip


def samples_by_step(run):
    samples = read_jsonl(run / "samples.jsonl")
    steps = sorted({s["step"] for s in samples})
    return {step: [{k: v for k, v in s.items() if k != "step"} for s in samples if s["step"] == step] for step in steps}


def test_console_shows_a_samples_table_at_the_first_step_and_every_third(trained):
    base, stdout = trained
    titles = [line.strip() for line in stdout.splitlines() if line.strip().endswith(": samples")]
    assert titles == ["step 1: samples", "step 3: samples"]
    header = next(line for line in stdout.splitlines() if line.startswith("┃") and "completion" in line)
    assert header.replace("┃", " ").split() == ["prompt", "completion", "numeric_answer", "reward", "adv", "len"]
    table = stdout[stdout.index("step 3: samples"):]
    rows = [line for line in table.splitlines() if line.startswith("│")][:4]
    for row, sample in zip(rows, samples_by_step(base / "run")[3], strict=True):
        cells = [c.strip() for c in row.split("│")[1:-1]]
        assert cells[1] == sample["completion"].replace("\n", "⏎").strip()
        assert cells[2:] == [f"{sample['rewards']['numeric_answer']:.3g}", f"{sample['reward']:.3g}",
                             f"{sample['advantage']:+.3f}", str(sample["length"])]  # fmt: skip


def test_samples_record_each_reward_and_the_length(trained):
    base, _ = trained
    for sample in read_jsonl(base / "run" / "samples.jsonl"):
        assert sample["reward"] == sample["rewards"]["numeric_answer"]  # the task's one function, weight 1
        assert 1 <= sample["length"] <= 5  # rollout.max_new_tokens of the task


def test_show_prints_the_run_and_writes_its_plots(trained):
    base, _ = trained
    run = base / "run"
    console = Console(file=io.StringIO(), width=160, color_system=None)
    plots = show_run(run, console=console)
    text = console.file.getvalue()
    assert text.splitlines()[0] == f"{run}: grpo, finished: 4 of 4 steps"
    assert "training.console_samples_every_steps" in text and "step 4: best 2 and worst 2 samples" in text
    assert plots == [str(run / "plots" / name) for name in ("overview.png", *(p.file for p in PANELS))]
    assert all(Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)


def test_samples_command_filters_the_run(trained, tmp_path):
    base, _ = trained
    out = tmp_path / "step2-short.jsonl"
    assert main(["samples", str(base / "run"), "--step", "2", "--max-length", "4", "--output", str(out)]) == 0
    expected = [s for s in read_jsonl(base / "run" / "samples.jsonl") if s["step"] == 2 and s["length"] <= 4]
    assert read_jsonl(out) == expected


def test_mlflow_file_store_holds_the_runs_metrics_and_samples(trained, monkeypatch):
    from mlflow import MlflowClient

    base, _ = trained
    run = base / "run"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(run / "mlruns").as_uri())
    (experiment,) = [e for e in client.search_experiments() if e.name == "rl-variants"]
    (stored,) = client.search_runs([experiment.experiment_id])
    assert stored.info.run_name == f"{base.name}/run" and stored.info.status == "FINISHED"
    assert stored.data.params["algo"] == "grpo" and stored.data.params["training.num_steps"] == "4"
    metrics = {(m.step, key): m.value for key in stored.data.metrics
               for m in client.get_metric_history(stored.info.run_id, key)}  # fmt: skip
    expected = {(step, mlflow_key(key)): value for (step, key), value in finite_scalars(run).items()}
    assert metrics == pytest.approx(expected, rel=1e-12, abs=0)
    local = Path(client.download_artifacts(stored.info.run_id, "samples", str(base / "mlflow-read")))
    for step, samples in samples_by_step(run).items():
        columns, rows = sample_table(step, samples)
        assert json.loads((local / Path(samples_artifact(step)).name).read_text()) == {"columns": columns, "data": rows}


TRACKIO_READER = textwrap.dedent("""
    import json, sys
    from trackio.sqlite_storage import SQLiteStorage
    print(json.dumps({"runs": SQLiteStorage.get_runs("rl-variants"),
                      "logs": SQLiteStorage.get_logs("rl-variants", sys.argv[1]),
                      "config": SQLiteStorage.get_run_config("rl-variants", sys.argv[1])}, default=str))
""")


def test_trackio_database_holds_the_runs_metrics_and_samples(trained):
    base, _ = trained
    run = base / "run"
    name = f"{base.name}/run"
    env = {**os.environ, "TRACKIO_DIR": str(base / "trackio")}  # trackio reads it once, when imported
    read = subprocess.run([sys.executable, "-c", TRACKIO_READER, name], env=env, check=True, capture_output=True)
    stored = json.loads(read.stdout)
    assert stored["runs"] == [name]
    assert stored["config"]["algo"] == "grpo" and stored["config"]["training"]["num_steps"] == 4
    logs = stored["logs"]
    scalars = {(log["step"], k): v for log in logs for k, v in log.items() if k not in ("step", "timestamp", "samples")}
    assert scalars == pytest.approx(finite_scalars(run), rel=1e-12, abs=0)
    tables = {log["step"]: log["samples"]["_value"] for log in logs if "samples" in log}
    for step, samples in samples_by_step(run).items():
        columns, rows = sample_table(step, samples)
        assert tables[step] == [dict(zip(columns, row, strict=True)) for row in rows]
