"""The collectives of a Qwen2.5-7B-shaped update, read from its compiled HLO.

benchmarks/collectives.py compiles the learner's own update (rl_core.train.trainable.update_program
of GRPO's loss; 2 layers of the 7B shape, abstract weights, bfloat16 compute over float32
masters, 2 micro-batches of 16 rows x 768 tokens, AdamW) on simulated CPU devices under the
learner's activation layout, and reports every collective. FSDP should gather weights and
reduce gradients, nothing else but the loss's scalar sums (its total, denominator and metrics,
4 bytes each); tensor parallelism adds its per-layer activation all-reduces, nothing larger.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multidevice

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "collectives.py"


def collectives(*args: str) -> dict:
    out = subprocess.run([sys.executable, str(SCRIPT), "--json", *args], env=dict(os.environ),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_fsdp8_moves_what_fsdp_needs_and_no_activation(layout):
    """Packed rows (training.packing) are packed and unpacked on each device: the same collectives."""
    result = collectives("--fsdp", "8", *(["--packed"] if layout == "packed" else []))
    # bfloat16 weights gathered for each micro-batch's forward and backward pass plus float32
    # gradients reduced once: ~17.4 GiB per device per step for these 1.56B parameters
    assert result["total_bytes"] <= 1.5 * result["fsdp_needs_bytes"]
    params = {tuple(s) for s in result["param_shapes"]}
    reduced = {tuple(dims) for dims, _ in result["all_reduce_arrays"]}
    assert reduced - {()}, "the gradients must be reduced somewhere"
    # only gradients, and the loss's scalar sums and metrics: no [rows x tokens, ...] activation
    assert reduced - {()} <= params, reduced - params
    assert all(size <= 4 for dims, size in result["all_reduce_arrays"] if not dims)
    # only weights, and token-sized bookkeeping ([16, 768, 1]: 48 KiB): no hidden state, which for
    # one micro-batch's 16 x 768 tokens is 16 x 768 x 3584 values (84 MiB in bfloat16)
    others = [(dims, size) for dims, size in result["all_gather_arrays"] if tuple(dims) not in params]
    assert all(size <= 2**16 for _, size in others), others


def test_fsdp4_tensor2_reduces_no_more_than_one_layers_activations():
    result = collectives("--fsdp", "4", "--tensor", "2")
    assert result["total_bytes"] <= 1.5 * result["fsdp_needs_bytes"]
    params = {tuple(s) for s in result["param_shapes"]}
    activations = [(dims, size) for dims, size in result["all_reduce_arrays"] if tuple(dims) not in params]
    assert activations  # tensor parallelism's own all-reduces of each layer's outputs
    # 4 rows per device x 768 tokens x 3584 hidden, float32: 42 MiB
    assert max(size for _, size in activations) <= result["one_layer_activation_bytes"]
