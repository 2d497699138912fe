"""`trainer train --resume`: an interrupted run continues exactly like an uninterrupted one.

Per algorithm, run A trains 4 steps straight; run B (same settings, its own
folder) is interrupted after step 3 and then resumed through the CLI with
`train --resume B`. Every metric except timings, every sampled completion, the
summary and the final checkpoint (parameters, optimizer state, PRNG key, data
position, algorithm state) must then be identical.

Two interruptions, both in-process so that they land on an exact step:
- Ctrl-C (GRPO): SIGINT is raised at the end of step 3 and goes through the
  handler `train` installs, which asks the learner to stop after the current
  step; the stop itself writes checkpoint 3 (checkpoints are every 2 steps),
  and the run ends with exit status 130 and a summary marked interrupted.
- a crash (DAPO): an exception ends the process's work right after step 3 was
  logged, before any checkpoint for it, so B resumes from checkpoint 2 and must
  first drop what step 3 left behind. DAPO carries surplus informative groups
  from one step to the next through the checkpoint, the state most easily lost.

The task is countdown, whose format reward (0.1) makes groups informative even
for a barely warm-started policy, so the updates are real, not zero.
"""

import json
import signal
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import yaml

from rl_core.learner.base import RLLearner
from trainer.cli import main

pytestmark = pytest.mark.e2e

SETTINGS = [
    "task.name=countdown",
    "warm_start.steps=20",
    "training.num_steps=4",
    "training.prompts_per_step=4",
    "algorithm.group_size=2",
    "eval.heldout_size=16",
    "eval.samples_per_prompt=2",
    "eval.pass_k=1",
    "eval.every_steps=2",
    "training.checkpoint_every_steps=2",
]
TIMING_KEYS = ("time/",)
TIMING_EXACT = ("perf/tokens_per_sec",)


class Crash(Exception):
    """Stands in for the process dying."""


def interrupt_after(step: int, how: str):
    """A `train_step` that runs the real one, then interrupts once `step` is done."""
    real = RLLearner.train_step

    def train_step(self):
        metrics = real(self)
        if self.step == step:
            if how == "ctrl-c":
                signal.raise_signal(signal.SIGINT)  # handled now, by `train`'s handler
            else:
                raise Crash(f"killed after step {step}")
        return metrics

    return train_step


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def without_timings(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(TIMING_KEYS) and k not in TIMING_EXACT}


def checkpoint(run: Path, step: int) -> tuple[dict, dict]:
    folder = (run / "checkpoints" / str(step)).absolute()
    arrays = ocp.StandardCheckpointer().restore(folder / "arrays")
    meta = json.loads((folder / "meta" / "metadata").read_text())
    return arrays, meta


@pytest.mark.parametrize(("algo", "how"), [("grpo", "ctrl-c"), ("dapo", "crash")])
def test_resume_continues_exactly_like_an_uninterrupted_run(algo, how, tmp_path, monkeypatch, capsys):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(["train", "--algo", algo, "--output", str(straight), "--no-progress", *SETTINGS]) == 0

    handler, sigterm_handler = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with monkeypatch.context() as patch:
        patch.setattr(RLLearner, "train_step", interrupt_after(3, how))
        if how == "ctrl-c":
            code = main(["train", "--algo", algo, "--output", str(resumed), "--no-progress", *SETTINGS])
            assert code == 128 + signal.SIGINT  # stopped early: not a success
            assert signal.getsignal(signal.SIGINT) is handler  # train's handlers are gone again
            assert signal.getsignal(signal.SIGTERM) is sigterm_handler
            summary = json.loads((resumed / "summary.json").read_text())
            assert summary["interrupted"].startswith("interrupted at step 3 of 4 by SIGINT; checkpoint 3 saved")
            assert summary["after"] is None  # no final evaluation for a stopped run
            err = capsys.readouterr().err
            assert err.strip().splitlines() == [f"trainer train: {summary['interrupted']}"]
        else:
            with pytest.raises(Crash):
                main(["train", "--algo", algo, "--output", str(resumed), "--no-progress", *SETTINGS])
    interrupted_at = 3 if how == "ctrl-c" else 2  # the checkpoint the resumed run starts from
    assert sorted(int(p.name) for p in (resumed / "checkpoints").iterdir()) == sorted({2, interrupted_at})
    assert [r["step"] for r in read_jsonl(resumed / "metrics.jsonl")] == [1, 2, 3]
    if algo == "dapo":
        _, meta = checkpoint(resumed, interrupted_at)
        assert meta["extra"]["carry"] is not None, "the scenario should resume with carried-over groups"
    capsys.readouterr()

    assert main(["train", "--resume", str(resumed), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"resumed {resumed} at step {interrupted_at}" in out
    assert "warm start" not in out  # the base policy came from the run folder

    # metrics: every step once, identical but for wall-clock figures
    a, b = read_jsonl(straight / "metrics.jsonl"), read_jsonl(resumed / "metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    assert a[0].keys() == b[0].keys()
    assert any(k.startswith("time/") for k in a[0])
    for ra, rb in zip(a, b, strict=True):
        assert without_timings(ra) == without_timings(rb), f"step {ra['step']}"
    # the updates were real: some groups had different rewards and moved the parameters
    assert any(r["groups/uniform_frac"] < 1.0 and r["train/grad_norm"] > 0 for r in a)

    # the same completions were sampled, each step once
    assert read_jsonl(straight / "samples.jsonl") == read_jsonl(resumed / "samples.jsonl")

    # the same held-out results and totals
    sa, sb = (json.loads((run / "summary.json").read_text()) for run in (straight, resumed))
    sa.pop("train_seconds"), sb.pop("train_seconds")
    assert sa == sb
    assert sa["steps"] == 4
    assert (straight / "eval_before.json").read_text() == (resumed / "eval_before.json").read_text()

    # the final checkpoints are bit for bit the same state
    (arrays_a, meta_a), (arrays_b, meta_b) = checkpoint(straight, 4), checkpoint(resumed, 4)
    assert meta_a == meta_b
    assert jax.tree.structure(arrays_a) == jax.tree.structure(arrays_b)
    for x, y in zip(jax.tree.leaves(arrays_a), jax.tree.leaves(arrays_b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # and the parameters did change between checkpoints 2 and 4
    first, _ = checkpoint(straight, 2)
    assert any(
        not np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(first["params"]), jax.tree.leaves(arrays_a["params"]), strict=True)
    )


def test_a_run_folder_from_before_later_settings_resumes_as_it_ran(tmp_path, capsys):
    """A folder whose config.yaml and settings_at_start.json lack settings added since (here a PPO
    run from before training.packing and model.critic_confidence) resumes with the values it ran
    with: no packing, and a critic without the confidence head, as its checkpoints hold."""
    run = tmp_path / "run"
    small = ["warm_start.steps=0", "training.prompts_per_step=2", "eval.every_steps=0", "eval.heldout_size=4",
             "eval.samples_per_prompt=1", "eval.pass_k=1", "training.checkpoint_every_steps=1"]
    assert main(["train", "--algo", "ppo", "--output", str(run), "--no-progress", "training.num_steps=1",
                 "model.critic_confidence=false", *small]) == 0
    config = yaml.safe_load((run / "config.yaml").read_text())
    started = json.loads((run / "settings_at_start.json").read_text())
    for settings in (config, started):  # what the older code wrote: neither setting existed
        del settings["training"]["packing"], settings["model"]["critic_confidence"]
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (run / "settings_at_start.json").write_text(json.dumps(started))
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--no-progress", "training.num_steps=2"]) == 0, capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    arrays = ocp.StandardCheckpointer().restore((run / "checkpoints" / "2" / "arrays").absolute())
    assert set(arrays["critic"]["params"]) == {"backbone", "value_head"}  # no confidence head
