"""Metric sinks: TensorBoard (scalars, the config and samples as text) and Weights & Biases offline.

One two-step `trainer train` run with `training.loggers=[tensorboard,wandb]`
and WANDB_MODE=offline; the tests read the TensorBoard event file and the
W&B run file back (their record formats: TFRecord and LevelDB-log framing of
protobufs) and compare with metrics.jsonl and samples.jsonl.
"""

import json
import math
import struct
import sys

import pytest
from tensorboardX.proto import event_pb2

from rl_core.config import ConfigError
from rl_core.run.sinks import WandbSink
from trainer.cli import main

pytestmark = pytest.mark.e2e

TINY = [
    "training.num_steps=2", "warm_start.steps=0", "training.prompts_per_step=2", "algorithm.group_size=2",
    "eval.heldout_size=8", "eval.samples_per_prompt=2", "eval.pass_k=1", "eval.every_steps=0",
]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("loggers") / "run"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_SILENT", "true")
        env.setenv("WANDB_CONSOLE", "off")
        env.setenv("WANDB_DIR", str(out.parent))  # W&B's own caches stay in the test's folder
        argv = ["train", "--algo", "grpo", "--output", str(out), "--no-progress", "training.loggers=[tensorboard,wandb]"]
        assert main(argv + TINY) == 0
    return out


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def tensorboard_events(run):
    """Every Event of the run's TensorBoard file (TFRecord: length, crc, data, crc)."""
    (path,) = (run / "tensorboard").glob("events.out.tfevents.*")
    data, pos, events = path.read_bytes(), 0, []
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        events.append(event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length]))
        pos += 12 + length + 4
    return events


def wandb_records(run):
    """Every Record of the offline W&B run file (a ':W&B' header, then LevelDB-log blocks of 32 KiB)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, parts, records = 7, [], []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        parts.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            records.append(wandb_internal_pb2.Record.FromString(b"".join(parts)))
            parts = []
    return records


def item_key(item):
    return item.key or "/".join(item.nested_key)


def finite_scalars(run) -> dict[tuple[int, str], float]:
    """(step, key) -> value for every finite number of metrics.jsonl: what each sink must hold."""
    return {
        (record["step"], key): value
        for record in read_jsonl(run / "metrics.jsonl")
        for key, value in record.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    }


def test_tensorboard_holds_scalars_config_and_samples(run):
    events = tensorboard_events(run)
    expected = finite_scalars(run)
    assert len(expected) >= 2 * 30  # every step logs its rewards, losses, drift, timings, ...
    written = [((e.step, v.tag), v.simple_value) for e in events for v in e.summary.value
               if v.WhichOneof("value") == "simple_value"]  # fmt: skip
    assert len(written) == len(dict(written))  # each scalar once
    # the same keys, each with metrics.jsonl's value (TensorBoard stores float32)
    assert dict(written) == pytest.approx(expected, rel=1e-6, abs=1e-30)
    texts = {}
    for e in events:
        for v in e.summary.value:
            if v.tag.startswith(("config", "samples")):
                texts[(v.tag.split("/")[0], e.step)] = v.tensor.string_val[0].decode()
    config = texts[("config", 0)]
    assert '"algo": "grpo"' in config and '"loggers": [\n      "tensorboard",\n      "wandb"\n    ]' in config
    for sample in read_jsonl(run / "samples.jsonl"):
        assert f"| {sample['id']} |" in texts[("samples", sample["step"])]


def test_wandb_offline_holds_scalars_config_and_a_samples_table(run):
    records = wandb_records(run)
    (config,) = [r.run.config for r in records if r.WhichOneof("record_type") == "run"]
    values = {item_key(i): json.loads(i.value_json) for i in config.update}
    assert values["algo"] == "grpo" and values["training"]["loggers"] == ["tensorboard", "wandb"]
    assert values["algorithm"]["group_size"] == 2  # the resolved config, algorithm defaults filled in

    history = [{item_key(i): json.loads(i.value_json) for i in r.history.item} for r in records if r.WhichOneof("record_type") == "history"]
    by_step = {h["_step"]: h for h in history}
    assert sorted(by_step) == [1, 2] and len(history) == 2
    # every finite number of metrics.jsonl with its value, and no other scalar: W&B's own
    # "_step", "_runtime" and "_timestamp" aside, and the samples table (its "samples/..." fields)
    logged = {(step, k): v for step, h in by_step.items() for k, v in h.items()
              if not k.startswith(("_", "samples/"))}  # fmt: skip
    assert logged == pytest.approx(finite_scalars(run), rel=1e-12, abs=0)
    samples = read_jsonl(run / "samples.jsonl")
    (files,) = (run / "wandb").glob("offline-run-*/files")
    for step in (1, 2):
        table = json.loads((files / by_step[step]["samples/path"]).read_text())
        assert table["columns"] == ["step", "id", "prompt", "completion", "length", "reward", "advantage",
                                    "reward/numeric_answer"]  # one column per reward function
        expected = [[s["step"], s["id"], s["prompt"], s["completion"], s["length"], s["reward"], s["advantage"],
                     s["rewards"]["numeric_answer"]] for s in samples if s["step"] == step]  # fmt: skip
        assert table["data"] == expected


def test_without_loggers_no_event_file_is_written(tmp_path):
    out = tmp_path / "quiet"
    assert main(["train", "--algo", "grpo", "--output", str(out), "--no-progress", "training.loggers=[]", *TINY]) == 0
    assert not (out / "tensorboard").exists() and not (out / "wandb").exists()
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2]


def test_wandb_missing_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"loggers includes 'wandb', but wandb is not installed: .*pip install 'trainer\[wandb\]'"):
        WandbSink(tmp_path, config={})
