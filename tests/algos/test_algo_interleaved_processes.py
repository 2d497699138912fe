"""Two processes whose devices interleave in the mesh train exactly as one process.

Real jax.distributed processes on localhost (gloo collectives), each with 2
simulated CPU devices; the fsdp=4 mesh alternates processes position by position,
so every batch's rows and every parameter's shards are scattered among them
(the layout a TPU slice's default device order gives). Three GRPO steps must
match one process with 4 devices to 1e-5, with synchronous and with async rollouts
(the async runs two steps ahead, training.max_staleness = 2, on packed rows, training.packing),
and so must the paged engine's sampled completions (one engine replica per device).
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.multidevice

SCRIPT = Path(__file__).parent / "scripts" / "interleaved_processes.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _start(processes: int, process_id: int, devices: int, coordinator: str, out: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), coordinator, str(processes), str(process_id), str(out)],
        cwd=SCRIPT.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _finish(proc: subprocess.Popen) -> None:
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]


def test_two_interleaved_processes_train_as_one(tmp_path):
    coordinator = f"localhost:{_free_port()}"
    procs = [_start(2, i, 2, coordinator, tmp_path / "two.npz") for i in range(2)]
    one = _start(1, 0, 4, "", tmp_path / "one.npz")
    for proc in (*procs, one):
        _finish(proc)
    two, ref = np.load(tmp_path / "two.npz"), np.load(tmp_path / "one.npz")
    assert two["owners"].tolist() == [0, 1, 0, 1]  # no process holds a block of consecutive rows
    assert ref["owners"].tolist() == [0, 0, 0, 0]
    np.testing.assert_allclose(two["metrics"], ref["metrics"], atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(two["paged_tokens"], ref["paged_tokens"])
    assert (two["paged_tokens"] != 0).sum() > 15  # real completions were compared
    np.testing.assert_allclose(two["paged_logp"], ref["paged_logp"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(two["async_staleness"], [0.0, 1.0, 2.0])  # k = 2
    for k in (k for k in ref.files if k.startswith("async_")):
        np.testing.assert_allclose(two[k], ref[k], atol=1e-5, rtol=1e-5)
    arrays = [k for k in ref.files if k.startswith("arr_")]
    assert len(arrays) > 10
    for k in arrays:
        np.testing.assert_allclose(two[k], ref[k], atol=1e-5, rtol=1e-5, err_msg=k)
