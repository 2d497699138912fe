"""`trainer train` on a real full disk: a 700 KiB tmpfs in a private mount namespace.

The run fails with one line naming the file and "No space left on device" (no traceback from
Orbax's threads or at interpreter exit), exit 2; its last complete checkpoint is intact, and
once the tmpfs is grown the resume from it finishes the run. Skipped where a tmpfs cannot be
mounted (no `unshare`, or a container without the rights); tests/trainer/test_trainer_bad_inputs.py
covers each write with an injected fault everywhere.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).parent / "scripts" / "full_disk.sh"
SETTINGS = ["--algo", "grpo", "--no-progress", "task.options.digits=1", "task.options.heldout_size=5",
            "warm_start.steps=0", "training.num_steps=4", "training.prompts_per_step=2", "algorithm.group_size=2",
            "training.checkpoint_every_steps=1", "eval.samples_per_prompt=1", "eval.pass_k=1", "eval.every_steps=0"]


def private_mounts() -> list[str]:
    """The command prefix that gives a process its own mount namespace where it may mount, or []."""
    if shutil.which("unshare") is None:
        return []
    for prefix in (["unshare", "-m", "--propagation", "private"], ["unshare", "-rm"]):
        probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                               capture_output=True, timeout=30)
        if probe.returncode == 0:
            return prefix
    return []


def test_a_run_on_a_full_tmpfs_is_one_line_and_resumes_from_its_last_checkpoint(tmp_path):
    prefix = private_mounts()
    if not prefix:
        pytest.skip("cannot mount a tmpfs in a private mount namespace here")
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    out.mkdir()
    done = subprocess.run([*prefix, "bash", str(SCRIPT), str(disk), str(out), sys.executable, *SETTINGS],
                          capture_output=True, text=True, timeout=1200, env=os.environ)
    assert done.returncode == 0, done.stdout + done.stderr
    run = disk / "run"
    err = (out / "first.err").read_text()
    assert int((out / "first.rc").read_text()) == 2, err
    kept = sorted(int(s) for s in (out / "first.checkpoints").read_text().split() if s.isdigit())
    assert kept, f"no checkpoint fit on the disk: {err}"
    line = re.fullmatch(
        rf"trainer train: error: {re.escape(str(run))}/\S+: No space left on device.*; the run stopped at step "
        rf"(\d+); checkpoint {kept[-1]} is kept: make room and continue with `trainer train --resume "
        rf"{re.escape(str(run))}`\n",
        err,
    )
    assert line, err
    resumed = (out / "resume.out").read_text()
    assert int((out / "resume.rc").read_text()) == 0, (out / "resume.err").read_text()[-3000:]
    assert f"resumed {run} at step {kept[-1]}" in resumed
    assert [json.loads(r)["step"] for r in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
