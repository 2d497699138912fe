"""Runs that need a fresh process: exact resume from a checkpoint, and data parallel on 4 CPU devices.

The data-parallel run starts in the background when this module starts, so
that it overlaps the resume test; the scripts live in `scripts/`.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from rl_core.runtime.mesh import data_mesh
from tolerances import approx, close

pytestmark = pytest.mark.multidevice

SCRIPTS = Path(__file__).parent / "scripts"
_spec = importlib.util.spec_from_file_location("rl_core_test_toy_run", SCRIPTS / "toy_run.py")
toy_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(toy_run)

TIMEOUT_S = 600
TIMING = ("time/", "perf/")


def one_device():
    """The in-process runs use one device, as the fresh processes they are compared with do (the
    multidevice tier's processes have 8: tests/conftest.py)."""
    return data_mesh(jax.devices()[:1])


@pytest.fixture(scope="module", autouse=True)
def data_parallel_run():
    """The 4-device run, started before any test of this module and collected by the test that needs it."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    env["JAX_PLATFORMS"] = "cpu"
    process = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "data_parallel.py")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    yield process
    if process.poll() is None:
        process.kill()
        process.communicate()


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(TIMING)}


def test_exact_resume_in_a_fresh_process(tmp_path):
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    learner = toy_run.make_learner(training=toy_run.RESUME_TRAINING, output_dir=str(straight), toy=toy_run.RESUME_TOY,
                                   mesh=one_device())
    initial = toy_run.params_numpy(learner)
    learner.train()  # 4 steps in one go, checkpoints at steps 2 and 4
    learner.close()
    assert learner.step == 4
    straight_params, straight_opt = toy_run.params_numpy(learner), jax.tree.leaves(learner.state.policy.opt_state)
    assert toy_run.max_abs_diff(initial, straight_params) > 1e-3  # the run learned something

    # A copy of the run as a process killed during step 4 leaves it: checkpoint 2 and
    # metrics of steps 1-3 (step 3's record deliberately wrong, to show it is replaced).
    shutil.copytree(straight, crashed)
    shutil.rmtree(crashed / "checkpoints" / "4")
    records = read_metrics(crashed)[:3]
    records[2]["train/loss"] = 12345.0
    (crashed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    out = subprocess.run(
        [sys.executable, str(SCRIPTS / "resume_run.py"), str(crashed)],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {"restored_step": 2, "final_step": 4}

    resumed = toy_run.make_learner(training=toy_run.RESUME_TRAINING, output_dir=str(crashed), toy=toy_run.RESUME_TOY,
                                   mesh=one_device())
    assert resumed.resume() and resumed.step == 4 and resumed.state.data_position == learner.state.data_position
    assert toy_run.max_abs_diff(toy_run.params_numpy(resumed), straight_params) <= 1e-6
    for a, b in zip(jax.tree.leaves(resumed.state.policy.opt_state), straight_opt, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **close(rtol=0, atol=1e-6))
    np.testing.assert_array_equal(jax.random.key_data(resumed.state.rng), jax.random.key_data(learner.state.rng))
    resumed.close()

    straight_metrics, resumed_metrics = read_metrics(straight), read_metrics(crashed)
    assert [r["step"] for r in resumed_metrics] == [1, 2, 3, 4]
    assert any(r["train/grad_norm"] > 0 for r in straight_metrics[2:])  # the resumed half had gradients
    for a, b in zip(straight_metrics, resumed_metrics, strict=True):
        assert without_timing(b) == approx(without_timing(a), rel=1e-6, abs=1e-7), f"step {a['step']}"


def test_data_parallel_on_4_devices_equals_1_device(data_parallel_run):
    stdout, stderr = data_parallel_run.communicate(timeout=TIMEOUT_S)
    assert data_parallel_run.returncode == 0, stderr[-4000:]
    result = json.loads(stdout.splitlines()[-1])
    assert result["device_count"] == 4
    assert result["one_device"]["devices"] == 1
    assert result["all_devices"]["devices"] == 4
    assert result["all_devices"]["shard_shapes"] == [[2, 1, 8]]  # 2 micro-batches x 1 of their 4 rows
    assert result["all_devices"]["params_replicated"]
    assert result["params_moved"] > 1e-3 and min(result["grad_norms"]) > 0  # both steps learned
    assert result["params_max_abs_diff"] <= 1e-5
    assert result["metrics_max_abs_diff"] <= 1e-5
