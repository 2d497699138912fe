"""rl_core.run.storage: a folder at a URL worked on in a local copy, and the recorder's checkpoints there.

fsspec's memory:// filesystem lives in this process; file:// is a real folder to look into.
"""

import json
import shutil
import tempfile

import fsspec
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core.run import storage
from rl_core.config import TrainingConfig
from rl_core.run.recorder import RunRecorder


class Crash(Exception):
    """Stands in for a lost connection."""


def cut_after_data(point, key=None):
    """`fault_point` where a push loses its connection after the checkpoints' data, before their markers."""
    if (point, key) == ("push", "data"):
        raise Crash("connection lost")


@pytest.fixture
def staging(tmp_path, monkeypatch):
    """The temporary folder, where the local copies are made (and must be gone after)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def save(folder, step: int) -> None:
    """A finished Orbax-like save of `step`: data, then the commit marker."""
    saved = folder / "checkpoints" / str(step)
    (saved / "arrays").mkdir(parents=True)
    (saved / "arrays" / "data").write_text(f"step {step}")
    (saved / storage.COMMIT_MARKER).write_text("done")


def test_urls_and_paths():
    assert storage.is_url("gs://bucket/run") and storage.is_url("file:///tmp/x") and storage.is_url("memory://x")
    assert not storage.is_url("runs/x") and not storage.is_url("/abs/x") and not storage.is_url("C:\\x")
    assert storage.child("gs://b/run/", "config.yaml") == "gs://b/run/config.yaml"
    with pytest.raises(storage.StorageError, match=r"^nosuch://b: no storage is known for nosuch://"):
        storage.filesystem("nosuch://b")


def test_a_push_cut_short_leaves_the_checkpoints_before_it_readable(tmp_path, staging, monkeypatch):
    """Cut after a checkpoint's data, before its commit marker: the checkpoint is not read back."""
    url, memory = f"memory://{tmp_path.name}/run", fsspec.filesystem("memory")
    folder = storage.open_staged(url)
    save(folder.local, 1)
    (folder.local / "metrics.jsonl").write_text('{"step": 1}\n')
    folder.push()
    save(folder.local, 2)
    (folder.local / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    monkeypatch.setattr(storage, "fault_point", cut_after_data)
    with pytest.raises(Crash):
        folder.push()
    monkeypatch.undo()
    folder.close()
    root = f"/{tmp_path.name}/run"
    assert memory.cat_file(f"{root}/checkpoints/2/arrays/data") == b"step 2"  # uploaded, without its marker

    again = storage.open_staged(url)
    assert sorted(p.name for p in (again.local / "checkpoints").iterdir()) == ["1"]
    assert (again.local / "metrics.jsonl").read_text() == '{"step": 1}\n'
    # the next push removes what the copy does not hold: the unfinished save, and a pruned one
    save(again.local, 3)
    shutil.rmtree(again.local / "checkpoints" / "1")
    again.push()
    again.close()
    assert sorted(memory.find(root)) == [
        f"{root}/checkpoints/3/arrays/data", f"{root}/checkpoints/3/{storage.COMMIT_MARKER}", f"{root}/metrics.jsonl",
    ]  # fmt: skip
    assert list(staging.iterdir()) == []


def test_a_checkpoint_saved_anew_over_a_complete_one_counts_only_once_complete(tmp_path, staging, monkeypatch):
    """A run replacing another at the URL saves step 1 again: the old step 1's marker goes first."""
    url = f"memory://{tmp_path.name}/run"
    first = storage.open_staged(url)
    save(first.local, 1)
    first.push()
    first.close()
    replacing = storage.open_staged(url, skip=("checkpoints",))  # as `trainer train --overwrite` pulls
    save(replacing.local, 1)
    (replacing.local / "checkpoints" / "1" / "arrays" / "data").write_text("the new run's step 1")
    monkeypatch.setattr(storage, "fault_point", cut_after_data)
    with pytest.raises(Crash):
        replacing.push()
    monkeypatch.undo()
    replacing.close()
    again = storage.open_staged(url)
    assert not (again.local / "checkpoints").exists()  # neither the old step 1 nor a mix of both
    again.close()


def test_a_file_url_holds_the_folder_as_it_is_locally(tmp_path, staging):
    target = tmp_path / "bucket" / "run"
    folder = storage.open_staged(target.as_uri())
    assert not folder.local.exists()  # nothing there yet
    save(folder.local, 1)
    save(folder.local, 2)
    (folder.local / "checkpoints" / "3.orbax-checkpoint-tmp-7").mkdir()  # a save under way: never mirrored
    (folder.local / "checkpoints" / "3.orbax-checkpoint-tmp-7" / "x").write_text("partial")
    (folder.local / "config.yaml").write_text("algo: grpo\n")
    folder.push()
    shutil.rmtree(folder.local / "checkpoints" / "1")  # pruned
    folder.push()
    assert folder.shown(f"{folder.local / 'config.yaml'} is bad") == f"{target.as_uri()}/config.yaml is bad"
    folder.close()
    # the files and folders of the local copy, and no empty folder of the pruned checkpoint
    files = sorted(p.relative_to(target).as_posix() for p in target.rglob("*"))
    assert files == [
        "checkpoints", "checkpoints/2", "checkpoints/2/arrays", "checkpoints/2/arrays/data",
        f"checkpoints/2/{storage.COMMIT_MARKER}", "config.yaml",
    ]  # fmt: skip
    assert list(staging.iterdir()) == []


def test_the_recorder_checkpoints_at_a_url_and_resumes_from_it(tmp_path, staging):
    """A learner's `output_dir` may be a URL: the recorder pulls, pushes each finished checkpoint, and cleans up."""
    url, memory = f"memory://{tmp_path.name}/run", fsspec.filesystem("memory")
    training = TrainingConfig(max_checkpoints_to_keep=1, loggers=())
    recorder = RunRecorder(url, training=training, run_config={}, writes=True)
    for step in (1, 2):
        recorder.metrics(step, {"loss": float(step)})
        recorder.save(step, arrays={"w": jnp.full(3, float(step))}, meta={"step": step})
        recorder.wait()
    recorder.metrics(3, {"loss": 3.0})  # logged after the last checkpoint: cut back on resume
    recorder.close()
    root = f"/{tmp_path.name}/run"
    assert memory.ls(f"{root}/checkpoints", detail=False) == [f"{root}/checkpoints/2"]  # 1 pruned there too
    assert [json.loads(line)["step"] for line in memory.cat_file(f"{root}/metrics.jsonl").decode().splitlines()] == [
        1, 2, 3,
    ]  # fmt: skip
    assert list(staging.iterdir()) == []

    resumed = RunRecorder(url, training=training, run_config={}, writes=True)
    arrays, meta = resumed.restore(like={"w": jnp.zeros(3)}, log=lambda _: None)
    assert meta == {"step": 2}
    np.testing.assert_array_equal(np.asarray(arrays["w"]), [2.0, 2.0, 2.0])
    assert [r["step"] for r in resumed.history] == [1, 2]
    resumed.close()
    assert [json.loads(line)["step"] for line in memory.cat_file(f"{root}/metrics.jsonl").decode().splitlines()] == [
        1, 2,
    ]  # fmt: skip
    assert list(staging.iterdir()) == []


def test_a_cached_copy_is_fetched_once_and_again_when_the_url_changes(tmp_path, monkeypatch):
    url, memory = f"memory://{tmp_path.name}/model", fsspec.filesystem("memory")
    memory.pipe_file(f"/{tmp_path.name}/model/config.json", b"{}")
    memory.pipe_file(f"/{tmp_path.name}/model/model.safetensors", b"weights")
    cache = tmp_path / "cache"
    local = storage.cached_copy(url, cache)
    assert sorted(p.name for p in local.iterdir()) == ["config.json", "model.safetensors"]
    fetched = []
    real_get = type(memory).get
    monkeypatch.setattr(type(memory), "get", lambda self, r, l, **kw: (fetched.append(r), real_get(self, r, l, **kw)))
    assert storage.cached_copy(url, cache) == local and fetched == []  # unchanged: not fetched again
    memory.pipe_file(f"/{tmp_path.name}/model/model.safetensors", b"new weights")
    assert (storage.cached_copy(url, cache) / "model.safetensors").read_bytes() == b"new weights"
    only = storage.cached_copy(url, cache, only=("config.json",))
    assert sorted(p.name for p in only.iterdir()) == ["config.json"]
    with pytest.raises(FileNotFoundError):
        storage.cached_copy(f"memory://{tmp_path.name}/nothing", cache)
