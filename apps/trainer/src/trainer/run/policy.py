"""The policy of a run folder at one of its checkpoints, for `trainer eval` and `trainer export`.

The run folder's `config.yaml` rebuilds the task, tokenizer and model; the
learner is built only for the shape of its checkpointed state (params,
optimizer state, RNG), which the checkpoint then fills. The run folder is only
read: no metrics, event files or checkpoints are written.

A LoRA run's checkpoints hold only the adapters: its base is rebuilt as the run
built it, from the model folder or the cached warm start (`base-policy-*` in the
run folder, or in the comparison folder two levels up).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from flax import nnx
from rl_core.run import CHECKPOINTS, storage
from rl_core import Checkpointer, RLLearner, Tokenizer
from rl_core.learner import state_arrays

from trainer import build
from trainer.run.folder import refuse_changed_settings, settings_of_run
from trainer.run.train import load_task, readable_run
from trainer.settings import RunSettings
from trainer.tasks import Task


class RunPolicy(NamedTuple):
    settings: RunSettings
    tokenizer: Tokenizer
    task: Task
    learner: RLLearner
    """Built for its sampler and graph; its own parameters are fresh, not the checkpoint's."""
    params: Any
    """The checkpoint's trained parameters (a dict of arrays; the adapters of a LoRA run)."""

    @property
    def policy_params(self) -> Any:
        """The whole policy: the checkpoint's parameters joined with the frozen base (if any)."""
        return self.learner.policy_params(self.params)

    @property
    def model(self) -> Any:
        """The policy at the checkpoint as an NNX module."""
        return nnx.merge(self.learner.policy.graphdef, self.params, self.learner.policy.frozen)
    step: int


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of the checkpoints in `run_dir/checkpoints` (folders named by their step)."""
    folder = run_dir / CHECKPOINTS
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()) if folder.is_dir() else []


def load_run_policy(run_dir: str | Path, step: int | None = None) -> RunPolicy:
    """The run's policy at checkpoint `step` (default: the latest); of a run at a URL, read from a local copy."""
    if storage.is_url(run_dir):
        with readable_run(run_dir) as local:
            return load_run_policy(local, step)
    run_dir = Path(run_dir)
    settings = settings_of_run(run_dir)
    refuse_changed_settings(run_dir, settings)  # the checkpoint is read as what it was made as
    steps = checkpoint_steps(run_dir)
    if not steps:
        raise FileNotFoundError(
            f"{run_dir / 'checkpoints'} holds no checkpoint: was the run trained with `trainer train`?"
        )
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise FileNotFoundError(f"{run_dir} has no checkpoint of step {step}; it keeps steps {steps}")
    tokenizer = build.tokenizer(settings)
    task = load_task(settings, tokenizer, log=lambda _: None)  # the prompts the run itself used
    # output_dir=None keeps the learner from opening a metrics file, an event file or a checkpoint manager
    policy = build.new_model(settings, tokenizer)
    if settings.model.lora.rank:  # the checkpoint holds adapters only: rebuild the frozen base
        cache = next((d for d in (run_dir, run_dir.parent, run_dir.parent.parent)
                      if (d / f"base-policy-{build.base_policy_key(settings)}").exists()), None)
        policy = build.adapted(settings, build.base_policy(settings, task, tokenizer, policy, cache, log=lambda _: None))
    # a distilling run's teacher is no part of its checkpoint: the learner is built for the shapes without it
    learner = build.learner(build.without_distillation(settings), task, tokenizer, policy, output_dir=None,
                            progress=False)
    checkpointer = Checkpointer(run_dir / CHECKPOINTS, read_only=True)  # the run may still be saving
    try:
        arrays, _ = checkpointer.restore(step, like=state_arrays(learner.state))
    finally:
        checkpointer.close()
    return RunPolicy(settings, tokenizer, task, learner, arrays["params"], step)
