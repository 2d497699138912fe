"""`trainer` with run folders, checkpoints, exports and model folders at URLs (rl_core.run.storage).

The end-to-end run repeats the shared `trained_run` (its config.yaml: two GRPO steps,
checkpoints at steps 1 and 2) at URLs and must end exactly where it did: the same records,
completions, summary and checkpoint, bit for bit. fsspec's memory:// filesystem lives in
this process, so the trainer runs in-process (`trainer.cli.main`).
"""

import json
import tempfile
from pathlib import Path

import fsspec
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from fsspec.registry import known_implementations
from rl_core.config import ConfigError
from rl_core.learner.base import RLLearner
from rl_models.hf import load_hf_model, load_hf_tokenizer
from trainer import build, model_folders
from trainer.cli import main
from trainer.settings import build_settings

pytestmark = pytest.mark.e2e

TIMINGS = ("time/", "perf/tokens_per_sec")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


class Crash(Exception):
    """Stands in for the process dying."""


def crash_after(step: int):
    """A `train_step` that runs the real one, then crashes once `step` is done (before its checkpoint)."""
    real = RLLearner.train_step

    def train_step(self):
        metrics = real(self)
        if self.step == step:
            raise Crash(f"killed after step {step}")
        return metrics

    return train_step


def records(text: str) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith(TIMINGS)} for line in text.splitlines() if line
    ]


def checkpoint(folder: Path, step: int) -> tuple[dict, dict]:
    """(arrays, meta) of a local run folder's checkpoint `step`."""
    saved = (folder / "checkpoints" / str(step)).absolute()
    return ocp.StandardCheckpointer().restore(saved / "arrays"), json.loads((saved / "meta" / "metadata").read_text())


@pytest.fixture
def staging(tmp_path, monkeypatch) -> Path:
    """The temporary folder, where the local copies of URL folders are made (and must be gone after)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_a_run_at_urls_trains_checkpoints_resumes_exactly_and_exports(trained_run, tmp_path, staging, capsys,
                                                                       monkeypatch):
    """Crashed after step 2 in a memory:// folder, copied to a file:// folder (as one copies a run
    between buckets), resumed there from checkpoint 1 and exported to memory://."""
    memory, root = fsspec.filesystem("memory"), f"/{tmp_path.name}/run"
    config = str(trained_run / "config.yaml")
    # the local run's cached evaluation of the base policy, found at the URL and used (not run again)
    cached = next(trained_run.glob("eval-base-*.json"))
    memory.pipe_file(f"{root}/{cached.name}", cached.read_bytes())
    with monkeypatch.context() as patch:
        patch.setattr(RLLearner, "train_step", crash_after(2))
        with pytest.raises(Crash):
            main(["train", "--algo", "grpo", "--config", config, "--output", f"memory://{root}", "--no-progress"])
    # at the URL: checkpoint 1, pushed once complete, and the records of step 2, pushed on the way out
    assert memory.ls(f"{root}/checkpoints", detail=False) == [f"{root}/checkpoints/1"]
    assert [r["step"] for r in records(memory.cat_file(f"{root}/metrics.jsonl").decode())] == [1, 2]
    assert list(staging.iterdir()) == []

    target = tmp_path / "bucket" / "run"
    memory.get(f"{root}/", str(target), recursive=True)
    capsys.readouterr()
    assert main(["train", "--resume", target.as_uri(), "--no-progress"]) == 0
    assert f"resumed {target.as_uri()} at step 1" in capsys.readouterr().out  # messages name the URL
    assert list(staging.iterdir()) == []

    # the files are really in the target folder, and it ended where the local run did
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in trained_run.iterdir())
    for name in ("metrics.jsonl", "samples.jsonl"):  # step 2 dropped and redone from checkpoint 1
        assert records((target / name).read_text()) == records((trained_run / name).read_text()), name
    summary, expected = (json.loads((run / "summary.json").read_text()) for run in (target, trained_run))
    summary.pop("train_seconds"), expected.pop("train_seconds")
    assert summary == expected
    assert sorted(p.name for p in (target / "checkpoints").iterdir()) == ["1", "2"]
    (arrays, meta), (arrays_ref, meta_ref) = checkpoint(target, 2), checkpoint(trained_run, 2)
    assert meta == meta_ref
    assert jax.tree.structure(arrays) == jax.tree.structure(arrays_ref)
    for x, y in zip(jax.tree.leaves(arrays), jax.tree.leaves(arrays_ref), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

    out = f"memory://{tmp_path.name}/hf"
    assert main(["export", "--run", target.as_uri(), "--out", out]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["run"], result["out"], result["step"]) == (target.as_uri(), out, 2)
    exported = tmp_path / "hf"
    memory.get(f"/{tmp_path.name}/hf/", str(exported), recursive=True)
    assert sorted(p.name for p in exported.iterdir()) == sorted(result["files"])
    params = nnx.state(load_hf_model(exported), nnx.Param)
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(arrays_ref["params"]), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert main(["export", "--run", target.as_uri(), "--out", out]) == 2  # not over an export without --overwrite
    assert f"--out {out} exists and is not empty (config.json" in capsys.readouterr().err
    assert list(staging.iterdir()) == []


def test_a_model_folder_at_a_url_is_fetched_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    memory, url = fsspec.filesystem("memory"), f"memory://{tmp_path.name}/qwen3"
    memory.put(str(FIXTURES / "qwen3"), f"/{tmp_path.name}/qwen3", recursive=True)
    settings = build_settings(algo="grpo", overrides=[f"model.path={url}"])
    assert model_folders.model_config(url).vocab_size == json.loads((FIXTURES / "qwen3" / "config.json").read_text())[
        "vocab_size"
    ]  # fmt: skip
    tokenizer = build.tokenizer(settings)
    assert tokenizer.encode("2+2") == load_hf_tokenizer(FIXTURES / "qwen3").encode("2+2")
    local = Path(model_folders.model_folder(url))
    assert local.is_relative_to(tmp_path / "cache" / "rl-variants" / "models")
    assert sorted(p.name for p in local.iterdir()) == sorted(p.name for p in (FIXTURES / "qwen3").iterdir())


def test_a_bad_url_is_one_line_naming_it_and_what_to_install(trained_run, capsys, monkeypatch):
    config = str(trained_run / "config.yaml")
    assert main(["train", "--algo", "grpo", "--config", config, "--output", "nosuch://bucket/run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainer train: error: nosuch://bucket/run: no storage is known for nosuch://"), err
    # a filesystem fsspec knows whose package is not installed, as gs:// without gcsfs
    monkeypatch.setitem(known_implementations, "fakefs",
                        {"class": "fakefs_package.FakeFileSystem", "err": "Install fakefs_package for fakefs://"})
    assert main(["export", "--run", str(trained_run), "--out", "fakefs://bucket/hf"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainer export: error: fakefs://bucket/hf: fakefs:// needs the package fakefs_package, "
                          "which is not installed"), err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(ConfigError, match="ModelSettings.path: fakefs://m: fakefs:// needs the package"):
        build_settings(algo="grpo", overrides=["model.path=fakefs://m"])
