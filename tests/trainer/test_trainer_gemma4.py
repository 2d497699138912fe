"""A GRPO step on the committed tiny Gemma 4 text folder (tests/fixtures/hf/gemma4_text: global
layers of their own shape, keys as values, KV shared by the last layers, per-layer inputs) through
`trainer train`, on the static sampler and on the paged engine."""

import json
from pathlib import Path

import numpy as np
import pytest

from trainer.cli import main

from gsm8k_step import one_step_argv

GEMMA4 = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "gemma4_text"


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ["static", "paged"])
def test_a_grpo_step_on_gemma4(tmp_path, engine):
    assert main(one_step_argv(GEMMA4, tmp_path, f"rollout.engine={engine}")) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["skipped_updates"] == 0


def test_forward_flops_and_parameters_of_the_tiny_gemma4_by_hand():
    """D 64, MLP 128, 4 heads; windowed layers 2 KV heads of 16, global 1 of 32 with keys as values;
    layers 4 and 5 share keys and values; per-layer inputs of 8; vocabulary 320 (tied)."""
    from math import prod

    from safetensors import safe_open

    from rl_models.hf import load_hf_config
    from trainer.bench.flops import block_matmul_weights, forward_flops, parameter_count

    config = load_hf_config(GEMMA4)
    windowed = 2 * 64 * 4 * 16  # q and o
    full = 2 * 64 * 4 * 32
    kv = 2 * 64 * 2 * 16  # a windowed layer's k and v
    k_only = 64 * 1 * 32  # a global layer's keys (its values)
    per_layer = 2 * 64 * 8  # each block's gate and projection
    mlp = 3 * 64 * 128
    w = 4 * windowed + 2 * full + 3 * kv + k_only + 6 * (mlp + per_layer) + 64 * 6 * 8
    assert block_matmul_weights(config) == w
    score = 4 * 4 * 32  # q.k and p.v over 4 heads of 32, in the 2 global layers
    expected = 2 * w * 3 + 2 * score * 6 + 2 * 64 * 320 * 2
    assert forward_flops(config, np.array([3]), np.array([2])) == expected
    with safe_open(GEMMA4 / "model.safetensors", framework="np") as f:
        stored = sum(prod(f.get_slice(k).get_shape()) for k in f.keys())
    assert parameter_count(config) == stored


def test_the_plan_counts_the_keys_and_values_of_the_layers_that_compute_them():
    """Of 6 layers, 4 compute keys and values (the last two share layer 3's and layer 2's): three
    windowed of 2 KV heads of 16, one global of 1 KV head of 32, float32: a token's keys and values
    take 2 * (3 * 32 + 32) * 4 = 1024 bytes, 768 of them the windowed layers' (their rings')."""
    from flax import nnx

    from rl_models import model_class
    from rl_models.hf import load_hf_config
    from trainer.plan.kv import kv_query_fields

    config = load_hf_config(GEMMA4)
    model = nnx.eval_shape(lambda: model_class(config)(config, rngs=nnx.Rngs(0)))
    fields, _ = kv_query_fields(config, model, rows=2, seq=16)
    assert fields["kv_token_bytes"] == 1024 and fields["ring_token_bytes"] == 768 and fields["ring_window"] == 4
    # the static sampler's cache: those 4 layers at full length, 2 rows of 16 slots
    assert fields["dense_cache_bytes"] == 2 * 16 * 1024
