"""A GRPO step on the committed tiny Qwen3.5 folder (the multimodal layout it ships in) through
`trainer train`: full fine-tuning, and LoRA on the linear-attention and attention projections with
an int8 base, each on the static sampler and on the paged engine (a state row per sequence beside
its paged KV); `trainer bench`'s FLOP count of the hybrid by hand."""

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

QWEN35 = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen35"


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    return one_step_argv(QWEN35, tmp_path, *extra)


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ["static", "paged"])
@pytest.mark.parametrize("extra", [(), ("model.lora.rank=4", "model.quantize=int8",
                                        "model.lora.targets=[q_proj, o_proj, in_proj_qkv, in_proj_z, out_proj]")],
                         ids=["full", "qlora"])
def test_a_grpo_step_on_qwen3_5(tmp_path, extra, engine):
    assert main(_argv(tmp_path, *extra, f"rollout.engine={engine}")) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["skipped_updates"] == 0


def test_forward_flops_of_the_tiny_qwen3_5_by_hand():
    """D 64, 4 layers (3 linear attention, 1 attention), MLP 64, vocabulary 320."""
    config = load_hf_config(QWEN35)
    attention = 2 * 64 * 4 * 32 + 2 * 64 * 2 * 32 + 4 * 32 * 64  # q with its gate, k and v, o: 32768
    linear = 64 * 128 + 64 * 64 + 2 * 64 * 4 + 64 * 64  # in_proj_qkv (2*32 + 64), z, a and b, out_proj: 16896
    w = attention + 3 * linear + 4 * 3 * 64 * 64  # and the MLP of every layer: 132608
    assert block_matmul_weights(config) == w
    recurrence = 3 * (6 * 4 * 16 * 16 + 2 * 4 * 128)  # per token: 4 value heads' 16x16 state products, the conv
    score = 4 * 4 * 32  # q.k and p.v over 4 heads of 32, in the one attention layer
    # 3 tokens, 2 unembedded: the dense matmuls, attention over 1 + 2 + 3 keys, the recurrence, the logits
    expected = 2 * w * 3 + score * 6 + recurrence * 3 + 2 * 64 * 320 * 2
    assert forward_flops(config, np.array([3]), np.array([2])) == expected
    # read at the last position only: the same work (the hybrid model runs every position)
    assert forward_flops(config, np.array([3]), np.array([2]), np.array([1])) == expected
    with safe_open(QWEN35 / "model.safetensors", framework="np") as f:
        text = sum(prod(f.get_slice(k).get_shape()) for k in f.keys() if not k.startswith("model.visual"))
    assert parameter_count(config) == text
