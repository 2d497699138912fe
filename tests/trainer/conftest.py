"""A trained run folder shared by the `trainer eval` and `trainer export` tests."""

import pytest

from trainer.cli import main

LR, WEIGHT_DECAY = 0.05, 0.1


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """A two-step GRPO run folder from `trainer train`, with checkpoints at steps 1 and 2.

    Random initial weights (no warm start) never answer right, so every group is
    tied and every gradient is exactly 0; AdamW's decoupled weight decay still
    moves the weights, by a known factor per step (`decay_per_step`):
    p_n = p_0 * (1 - lr * wd)^n.
    """
    run = tmp_path_factory.mktemp("eval") / "run"
    argv = [
        "train", "--algo", "grpo", "--output", str(run), "--no-progress",
        "training.num_steps=2", "training.checkpoint_every_steps=1", "warm_start.steps=0",
        f"training.learning_rate={LR}", f"training.weight_decay={WEIGHT_DECAY}",
        "eval.heldout_size=16", "eval.samples_per_prompt=4", "eval.pass_k=2", "eval.every_steps=0",
        "training.prompts_per_step=4", "algorithm.group_size=2", "algorithm.beta=0.0",
    ]  # fmt: skip
    assert main(argv) == 0
    return run


@pytest.fixture(scope="session")
def decay_per_step():
    return 1 - LR * WEIGHT_DECAY
