"""Real processes killed at named points resume to exactly the uninterrupted run.

One `trainer train` run goes through a chain of real processes, each stopped at
a named point by `RL_VARIANTS_FAULTS` (deterministic: the process sends itself
the signal when it passes the point), then resumed with `--resume`:

  1. SIGKILL in the warm start, after its checkpoint at step 4 of 8;
  2. SIGKILL inside the first checkpoint save (its temporary folder is left);
  3. SIGKILL after step 3 is logged, before its checkpoint;
  4. SIGKILL while resuming, in the rewrite of samples.jsonl (before the rename);
  5. SIGTERM in the middle of step 3: the step ends, checkpoint 3, exit 143;
  6. SIGTERM in step 4 and again inside its checkpoint save: exit at once;
  7. SIGKILL in the final evaluation;
  8. then the newest checkpoint is damaged on disk, and the run finishes.

The result must equal one uninterrupted run (the reference, run alongside):
metrics rows (each step once, identical but for timings), samples, summary,
TensorBoard points, and checkpoints 3 and 4 bit for bit (params, optimizer
state, PRNG key, data position). Then the finished run is resumed with no
change (nothing happens) and extended by one step.
"""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from tensorboardX.proto import event_pb2

from rl_core.run.checkpoint import saved_steps
from rl_core.run.layout import CORRUPT_CHECKPOINTS
from rl_core.run.faults import ENV

pytestmark = pytest.mark.e2e

# countdown: its format reward (0.1) makes some groups informative even for a barely
# warm-started policy, so steps 3 and 4 have real updates
SETTINGS = [
    "task.name=countdown",
    "task.options.heldout_size=8",
    "warm_start.steps=8",
    "warm_start.batch_size=16",
    "warm_start.checkpoint_every_steps=4",
    "training.num_steps=4",
    "training.prompts_per_step=2",
    "training.checkpoint_every_steps=1",
    "training.max_checkpoints_to_keep=2",
    "algorithm.group_size=2",
    "eval.samples_per_prompt=1",
    "eval.pass_k=1",
    "eval.every_steps=0",
]
TIMEOUT_S = 600
KILLED = -9
TERMINATED = 128 + 15


def trainer(*args: str, faults: str | None = None, wait: bool = True):
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if faults:
        env[ENV] = faults
    command = [sys.executable, "-m", "trainer.cli", "train", *args, "--no-progress"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return process
    out, err = process.communicate(timeout=TIMEOUT_S)
    return process.returncode, out, err


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def steps_of(path: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(path)]


def without_timings(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith("time/") and k != "perf/tokens_per_sec"}


def checkpoint(run: Path, step: int) -> tuple[list[np.ndarray], dict, object]:
    folder = (run / "checkpoints" / str(step)).absolute()
    arrays = ocp.StandardCheckpointer().restore(folder / "arrays")
    meta = json.loads((folder / "meta" / "metadata").read_text())
    return [np.asarray(x) for x in jax.tree.leaves(arrays)], meta, jax.tree.structure(arrays)


def scalar_points(run: Path) -> dict[tuple[str, int], int]:
    """(tag, step) -> how many times a scalar was written, over every event file of the run.

    Text summaries are left out: each process records the run's settings as text at step 0.
    """
    counts: dict[tuple[str, int], int] = {}
    for path in (run / "tensorboard").glob("events.out.tfevents.*"):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            event = event_pb2.Event()
            event.ParseFromString(data[offset + 12 : offset + 12 + length])
            for value in event.summary.value:
                if not value.HasField("simple_value"):
                    continue
                counts[(value.tag, event.step)] = counts.get((value.tag, event.step), 0) + 1
            offset += 16 + length
    return counts


def assert_no_traceback(err: str) -> None:
    assert "Traceback" not in err, err[-3000:]


@pytest.fixture
def shared_compilation_cache(tmp_path, monkeypatch):
    """The processes compile the same programs: a shared compilation cache halves their CPU time
    (they run the very same executables, so results are unchanged)."""
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "xla-cache"))
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def test_killed_at_every_named_point_the_run_resumes_to_the_uninterrupted_result(tmp_path, shared_compilation_cache):
    straight, run = tmp_path / "straight", tmp_path / "run"
    reference = trainer("--algo", "grpo", "--output", str(straight), *SETTINGS, wait=False)
    resume = ("--resume", str(run))

    # 1. killed in the warm start: the next process continues it from its step-4 checkpoint
    code, _, err = trainer("--algo", "grpo", "--output", str(run), *SETTINGS, faults="kill@warm_start:6")
    assert code == KILLED, err[-3000:]
    assert [p.name for p in run.glob("base-policy-*")] == [next(run.glob("base-policy-*")).name]
    assert next(run.glob("base-policy-*")).name.endswith(".partial")
    assert steps_of(run / "sft_metrics.jsonl") == [1, 2, 3, 4]  # written with the warm start's checkpoint 4

    # 2. killed inside the first checkpoint save: the temporary folder is not a checkpoint
    code, out, err = trainer(*resume, faults="kill@checkpoint:1")
    assert code == KILLED, err[-3000:]
    assert "warm start: continuing from step 4 of 8" in out
    assert steps_of(run / "sft_metrics.jsonl") == list(range(1, 9))  # steps 5 and 6 once, not twice
    assert saved_steps(run / "checkpoints") == []
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["1.orbax-checkpoint-tmp"]
    assert steps_of(run / "metrics.jsonl") == [1]

    # 3. killed after step 3 is logged, before its checkpoint: the run starts over from step 0,
    #    not from the unfinished save, and step 1 is not logged twice
    code, out, err = trainer(*resume, faults="kill@logged:3")
    assert code == KILLED, err[-3000:]
    assert "resumed" not in out and "warm start," not in out  # the base policy was cached when it ended
    assert steps_of(run / "metrics.jsonl") == [1, 2, 3]
    assert saved_steps(run / "checkpoints") == [1, 2]

    # 4. killed while resuming, between writing the new samples.jsonl and renaming it over the old
    before = (run / "samples.jsonl").read_text()
    code, out, err = trainer(*resume, faults="kill@rewrite:samples")
    assert code == KILLED, err[-3000:]
    assert steps_of(run / "metrics.jsonl") == [1, 2]  # rewritten before samples
    assert (run / "samples.jsonl").read_text() == before  # the old file, whole: not empty, not cut
    assert max(steps_of(run / "samples.jsonl")) == 3

    # 5. SIGTERM in the middle of step 3: the step finishes, checkpoint 3, one line, exit 143
    code, out, err = trainer(*resume, faults="term@step:3")
    assert code == TERMINATED, err[-3000:]
    assert_no_traceback(err)
    last = err.strip().splitlines()[-1]
    assert last.startswith("trainer train: interrupted at step 3 of 4 by SIGTERM; checkpoint 3 saved; continue with")
    assert "SIGTERM: stopping after the current step" in out
    assert saved_steps(run / "checkpoints") == [2, 3]
    assert json.loads((run / "summary.json").read_text())["interrupted"].startswith("interrupted at step 3 of 4")
    assert steps_of(run / "metrics.jsonl") == [1, 2, 3]

    # 6. SIGTERM in step 4, and again while its checkpoint is being saved: out at once, checkpoint 3 intact
    code, out, err = trainer(*resume, faults="term@step:4,term@checkpoint:4")
    assert code == TERMINATED, err[-3000:]
    assert_no_traceback(err)
    assert err.strip().splitlines()[-1] == "trainer: SIGTERM: exiting now; the last finished checkpoint is kept"
    assert saved_steps(run / "checkpoints") == [2, 3]

    # 7. killed in the final evaluation: every step is done and saved, no more checkpoints than the limit
    code, out, err = trainer(*resume, faults="kill@final_eval")
    assert code == KILLED, err[-3000:]
    assert f"resumed {run} at step 3" in out
    assert saved_steps(run / "checkpoints") == [3, 4]
    assert steps_of(run / "metrics.jsonl") == [1, 2, 3, 4]

    # 8. checkpoint 4 damaged on disk: moved aside with one line, step 4 redone from checkpoint 3
    for path in (run / "checkpoints" / "4" / "arrays").rglob("*"):
        if path.is_file() and "METADATA" not in path.name.upper():
            path.write_bytes(b"\0" * 7)
    code, out, err = trainer(*resume)
    assert code == 0, err[-3000:]
    damaged = [line for line in out.splitlines() if line.startswith("checkpoint 4 does not restore")]
    assert len(damaged) == 1 and damaged[0].endswith(f"moved it to {run / CORRUPT_CHECKPOINTS / '4'}")
    assert f"resumed {run} at step 3" in out
    assert (run / CORRUPT_CHECKPOINTS / "4").is_dir()  # kept for inspection, not deleted
    assert saved_steps(run / "checkpoints") == [3, 4]

    # the uninterrupted run, side by side
    ref_out, ref_err = reference.communicate(timeout=TIMEOUT_S)
    assert reference.returncode == 0, ref_err[-3000:]
    a, b = read_jsonl(straight / "metrics.jsonl"), read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    assert any(r["train/grad_norm"] > 0 for r in a)  # the updates were real
    for ra, rb in zip(a, b, strict=True):
        assert without_timings(ra) == without_timings(rb), f"step {ra['step']}"
    assert read_jsonl(straight / "samples.jsonl") == read_jsonl(run / "samples.jsonl")
    sa, sb = (json.loads((r / "summary.json").read_text()) for r in (straight, run))
    sa.pop("train_seconds"), sb.pop("train_seconds")
    assert sa == sb and sa["steps"] == 4 and "interrupted" not in sb
    assert (straight / "eval_before.json").read_text() == (run / "eval_before.json").read_text()
    sft_a, sft_b = read_jsonl(straight / "sft_metrics.jsonl"), read_jsonl(run / "sft_metrics.jsonl")
    assert [without_timings(r) for r in sft_a] == [without_timings(r) for r in sft_b] and len(sft_a) == 8
    points = scalar_points(run)
    assert points.keys() == scalar_points(straight).keys()
    assert {step for _, step in points} == {1, 2, 3, 4}
    assert set(points.values()) == {1}, "a TensorBoard point was written twice"
    for step in (3, 4):
        (xa, meta_a, tree_a), (xb, meta_b, tree_b) = checkpoint(straight, step), checkpoint(run, step)
        assert meta_a == meta_b and tree_a == tree_b
        for x, y in zip(xa, xb, strict=True):
            np.testing.assert_array_equal(x, y)
    moved = [not np.array_equal(x, y) for x, y in zip(checkpoint(straight, 3)[0], checkpoint(straight, 4)[0])]
    assert any(moved)  # step 4 changed the state

    # a finished run resumed with no change: nothing is run, not even the evaluation
    summary = (run / "summary.json").read_text()
    code, out, err = trainer(*resume)
    assert code == 0, err[-3000:]
    assert f"{run} is finished (4 of 4 steps); nothing to do" in out
    assert "held-out accuracy" not in out
    assert (run / "summary.json").read_text() == summary

    # extended by one step: steps 1-4 stay as they were, step 5 is added once
    code, out, err = trainer(*resume, "training.num_steps=5")
    assert code == 0, err[-3000:]
    assert f"resumed {run} at step 4" in out
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[:4] == b
    assert json.loads((run / "summary.json").read_text())["steps"] == 5
    assert "num_steps: 5" in (run / "config.yaml").read_text()
    assert saved_steps(run / "checkpoints") == [4, 5]


def test_an_async_run_killed_with_a_batch_in_flight_resumes_to_the_uninterrupted_result(
        tmp_path, shared_compilation_cache):
    """training.async_rollout=one_step: SIGKILL on the rollout thread in step 3, the next batch
    collected and the update maybe not done. The newest finished checkpoint (1, or 2 when its
    background save finished before the kill) holds the next batch in flight, sampled by the
    weights of the step before; the resumed run trains on it and ends as the uninterrupted one."""
    settings = [*SETTINGS, "training.async_rollout=one_step", "algorithm.tis_cap=2.0"]
    straight, run = tmp_path / "straight", tmp_path / "run"
    reference = trainer("--algo", "grpo", "--output", str(straight), *settings, wait=False)
    code, _, err = trainer("--algo", "grpo", "--output", str(run), *settings, faults="kill@in_flight:3")
    assert code == KILLED, err[-3000:]
    last = saved_steps(run / "checkpoints")[-1]
    assert last in (1, 2)
    meta = checkpoint(run, last)[1]
    [flight] = meta["in_flight"]  # one batch ahead (training.max_staleness = 1)
    assert flight["version"] == last - 1 and len(flight["batch"]["texts"]) == 4  # 2 prompts x 2
    code, out, err = trainer("--resume", str(run))
    assert code == 0, err[-3000:]
    assert f"resumed {run} at step {last}" in out
    ref_out, ref_err = reference.communicate(timeout=TIMEOUT_S)
    assert reference.returncode == 0, ref_err[-3000:]
    a, b = read_jsonl(straight / "metrics.jsonl"), read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert [r["async/staleness"] for r in a] == [0.0, 1.0, 1.0, 1.0]
    for ra, rb in zip(a, b, strict=True):
        assert without_timings(ra) == without_timings(rb), f"step {ra['step']}"
    assert read_jsonl(straight / "samples.jsonl") == read_jsonl(run / "samples.jsonl")
    (xa, meta_a, _), (xb, meta_b, _) = checkpoint(straight, 4), checkpoint(run, 4)
    for meta in (meta_a, meta_b):  # batch 5, in flight: the same but for how long it took
        meta["in_flight"][0]["batch"]["info"] = without_timings(meta["in_flight"][0]["batch"]["info"])
    assert meta_a == meta_b
    for x, y in zip(xa, xb, strict=True):
        np.testing.assert_array_equal(x, y)
