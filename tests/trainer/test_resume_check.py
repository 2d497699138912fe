"""benchmarks/resume_check.py, the accelerator check's resume step, run here on the CPU: its runs
resume to the uninterrupted one, and each kind of difference it looks for is reported."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("resume_check", ROOT / "benchmarks" / "resume_check.py")
resume_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(resume_check)


def test_a_run_killed_twice_resumes_to_the_straight_one_and_a_tampered_one_is_caught(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "xla-cache"))  # the four processes share programs
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    assert resume_check.main([str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "killed after step 3 is logged: exit -9" in out and "resumed to the end: exit 0" in out
    assert out.strip().splitlines()[-1].startswith("resume check: the resumed run equals the uninterrupted one")
    straight, run = tmp_path / "out" / "straight", tmp_path / "out" / "run"
    assert resume_check.differences(straight, run) == []

    metrics = resume_check.rows(run / "metrics.jsonl")
    metrics[1]["train/loss"] += 1e-6
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    folder = (run / "checkpoints" / "4" / "arrays").absolute()
    arrays = ocp.StandardCheckpointer().restore(folder)
    leaves, tree = jax.tree.flatten(arrays)
    leaves[0] = np.asarray(leaves[0]).copy()
    leaves[0].flat[0] += 1
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(folder, jax.tree.unflatten(tree, leaves), force=True)
    checkpointer.wait_until_finished()
    assert resume_check.differences(straight, run) == [
        "metrics of step 2", f"checkpoint 4: 1 of {len(leaves)} arrays differ"]
