"""A GRPO step on the committed tiny Qwen3.5-MoE folder (the multimodal layout it ships in) through
`trainer train`, on the static sampler and on the paged engine, replaying the rollout's routing
in the learner's passes; `trainer bench`'s FLOP count of the hybrid with experts by hand."""

import json
from math import prod
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from rl_models.hf import load_hf_config
from trainer.bench.flops import block_matmul_weights, forward_flops, parameter_count
from trainer.cli import main

from gsm8k_step import one_step_argv

QWEN35_MOE = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen35_moe"


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    return one_step_argv(QWEN35_MOE, tmp_path, *extra)


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ["static", "paged"])
def test_a_grpo_step_on_qwen3_5_moe_replaying_the_rollouts_routing(tmp_path, engine):
    assert main(_argv(tmp_path, f"rollout.engine={engine}", "algorithm.routing_replay=rollout")) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["skipped_updates"] == 0


def test_forward_flops_of_the_tiny_qwen3_5_moe_by_hand():
    """D 64, 4 layers (3 linear attention, 1 attention), 8 experts of 32 (2 a token), a shared
    expert of 48 with its gate, vocabulary 320."""
    config = load_hf_config(QWEN35_MOE)
    attention = 2 * 64 * 4 * 32 + 2 * 64 * 2 * 32 + 4 * 32 * 64  # q with its gate, k and v, o: 32768
    linear = 64 * 128 + 64 * 64 + 2 * 64 * 4 + 64 * 64  # in_proj_qkv, z, a and b, out_proj: 16896
    mlp = 64 * 8 + 2 * 3 * 64 * 32 + 3 * 64 * 48 + 64  # router, 2 experts, the shared expert and its gate
    w = attention + 3 * linear + 4 * mlp
    assert block_matmul_weights(config) == w
    recurrence = 3 * (6 * 4 * 16 * 16 + 2 * 4 * 128)
    expected = 2 * w * 3 + 4 * 4 * 32 * 6 + recurrence * 3 + 2 * 64 * 320 * 2
    assert forward_flops(config, np.array([3]), np.array([2])) == expected
    with safe_open(QWEN35_MOE / "model.safetensors", framework="np") as f:
        text = sum(prod(f.get_slice(k).get_shape()) for k in f.keys() if not k.startswith("model.visual"))
    assert parameter_count(config) == text
