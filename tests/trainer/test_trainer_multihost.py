"""Two processes joined by jax.distributed train exactly as one process with their devices.

Real `trainer train` processes on localhost, each with 2 simulated CPU devices,
joined through a coordinator on a free port (gloo collectives), against one
process with 4 devices. Same mesh shape (fsdp=4), same global programs, so the
results may differ only by the order in which the collectives add floats.

One process is killed after step 2 is logged, before its checkpoint (the other
is stuck in a collective then and is killed by the test); both are resumed
from checkpoint 1 and finish step 3. The run must end as the one-process run:
parameters to 1e-5, every metric of metrics.jsonl (timings aside) to 1e-5,
samples.jsonl identical, and only process 0 writes the run's files.

The supervised warm start runs in one process, so the multi-process run starts
from the base policy the reference made (copied into its folder), as a user
would make it once before launching on many hosts.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rl_core.run.faults import ENV
from tolerances import approx, close

pytestmark = pytest.mark.multidevice

# countdown's format reward makes some groups informative after a short warm start:
# the updates are real (non-zero gradients), not only weight decay. SGD, not AdamW:
# Adam divides by sqrt(v), which turns the ~1e-7 rounding differences of near-zero
# gradient entries (the collectives add in another order) into learning-rate-sized
# parameter differences; SGD shows the computation itself (as tests/algos/scripts/mesh_parallel.py).
SETTINGS = [
    "task.name=countdown",
    "task.options.heldout_size=4",
    "warm_start.steps=8",
    "warm_start.batch_size=16",
    "training.num_steps=3",
    "training.optimizer=sgd",
    "training.learning_rate=0.1",
    "training.prompts_per_step=4",
    "training.checkpoint_every_steps=1",
    "training.max_checkpoints_to_keep=3",
    "training.mesh.fsdp=4",
    "algorithm.group_size=2",
    "rollout.max_new_tokens=12",
    "eval.samples_per_prompt=1",
    "eval.pass_k=1",
    "eval.every_steps=0",
]
TIMEOUT_S = 900
KILLED = -signal.SIGKILL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def env_with(devices: int, cache: Path, faults: str | None = None) -> dict[str, str]:
    """The environment of a trainer process; `cache`: the test's own compilation cache (its
    processes are killed, possibly mid-write: the suite's shared cache stays out of it)."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    if faults:
        env[ENV] = faults
    return env


def trainer(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """A `trainer train` process writing its output to `log` (a pipe nobody reads while
    polling could fill up and stall it)."""
    command = [sys.executable, "-m", "trainer.cli", "train", *args, "--no-progress"]
    with log.open("w") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def run_processes(args: list[str], logs: Path, faults: dict[int, str] | None = None) -> list[tuple[int, str]]:
    """Two processes of one run; when one ends with an error the other is killed (it would
    wait in a collective for its partner for ever). Returns (exit code, output) per process."""
    port, faults = free_port(), faults or {}
    paths = [logs.with_name(f"{logs.name}.{i}.log") for i in range(2)]
    procs = [
        trainer(
            [*args, "--coordinator", f"localhost:{port}", "--num-processes", "2", "--process-id", str(i)],
            env_with(2, logs.parent / "xla-cache", faults.get(i)),
            paths[i],
        )
        for i in range(2)
    ]
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [(p.wait(), path.read_text()) for p, path in zip(procs, paths, strict=True)]


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "perf/tokens_per_sec"} for r in rows]


def params(run: Path, step: int) -> list[np.ndarray]:
    """A checkpoint's arrays, read onto this process's one device (it was saved from four)."""
    path = (run / "checkpoints" / str(step) / "arrays").absolute()
    checkpointer = ocp.StandardCheckpointer()
    here = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    like = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=here), checkpointer.metadata(path).item_metadata
    )
    return [np.asarray(x) for x in jax.tree.leaves(checkpointer.restore(path, like))]


def test_two_processes_killed_and_resumed_end_as_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    reference = trainer(["--algo", "grpo", "--output", str(one), *SETTINGS], env_with(4, tmp_path / "xla-cache"), tmp_path / "one.log")
    code = reference.wait(timeout=TIMEOUT_S)
    assert code == 0, (tmp_path / "one.log").read_text()[-3000:]
    records = metrics(one)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert max(r["train/grad_norm"] for r in records) > 0  # real updates, not weight decay alone

    # the base policy the one-process run made (the warm start is single-process)
    two.mkdir()
    for cached in one.glob("base-policy-*"):
        shutil.copytree(cached, two / cached.name)

    # process 1 is killed after step 2 is logged, before checkpoint 2; process 0 is then stuck and killed
    (code0, out0), (code1, out1) = run_processes(
        ["--algo", "grpo", "--output", str(two), *SETTINGS], tmp_path / "killed", {1: "kill@logged:2"}
    )
    assert code1 == KILLED, out1[-3000:]
    assert code0 == KILLED, out0[-3000:]
    assert "held-out accuracy before RL" in out0 and "held-out accuracy" not in out1  # process 0 speaks for the run
    # killed before checkpoint 2 was written: checkpoint 1 is the newest
    assert sorted(int(p.name) for p in (two / "checkpoints").iterdir() if p.name.isdigit()) == [1]

    # both resumed: from checkpoint 1, to the end
    results = run_processes(["--resume", str(two)], tmp_path / "resumed")
    for code, out in results:
        assert code == 0, out[-3000:]
    assert re.findall(rf"resumed {re.escape(str(two))} at step (\d+)", results[0][1]) == ["1"]
    assert '"algo": "grpo"' in results[0][1] and '"algo"' not in results[1][1]  # one summary, process 0's

    resumed = metrics(two)
    assert [r["step"] for r in resumed] == [1, 2, 3]
    for want, got in zip(records, resumed, strict=True):
        assert want.keys() == got.keys()
        for key, value in want.items():
            assert got[key] == approx(value, rel=1e-5, abs=1e-5), (want["step"], key)
    assert (two / "samples.jsonl").read_text() == (one / "samples.jsonl").read_text()
    for want, got in zip(params(one, 3), params(two, 3), strict=True):
        np.testing.assert_allclose(got, want, **close(rtol=0, atol=1e-5))
    summary = json.loads((two / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["after"] == json.loads((one / "summary.json").read_text())["after"]
    # one writer: a single TensorBoard event file per process that wrote, i.e. process 0's two launches
    assert len(list((two / "tensorboard").glob("events.out.tfevents.*"))) == 2
