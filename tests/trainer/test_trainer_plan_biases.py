"""`trainer plan` on a folder with Llama-style attention and MLP biases counts them: the parameters
it plans for are exactly the folder's tensors (q/k/v/o and gate/up/down biases included)."""

from math import prod
from pathlib import Path

import pytest
from safetensors import safe_open
from trainer.plan import memory_budget, plan
from trainer.settings import build_settings

FOLDER = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "llama_bias"


@pytest.mark.e2e  # compiles the learner's programs on abstract shapes (~7 s on CPU)
def test_plan_counts_the_bias_parameters():
    settings = build_settings(algo="grpo", overrides=[f"model.path={FOLDER}", "training.prompts_per_step=2",
                                                      "algorithm.group_size=2"])
    result = plan(settings, memory_budget("gpu"))
    with safe_open(FOLDER / "model.safetensors", framework="np") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    biases = sum(prod(s) for k, s in shapes.items() if k.endswith(".bias"))
    # 2 layers x (q 64 + k 32 + v 32 + o 64 + gate 128 + up 128 + down 64)
    assert biases == 2 * 512
    assert result.parameters == sum(prod(s) for s in shapes.values())
