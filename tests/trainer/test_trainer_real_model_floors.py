"""benchmarks/real_model_floors.py: the floors' arithmetic on hand-computed numbers (no model, no timing)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from rl_models import TransformerConfig, preset
from trainer.bench.flops import prefill_flops, sampling_flops

_spec = importlib.util.spec_from_file_location(
    "real_model_floors", Path(__file__).resolve().parents[2] / "benchmarks" / "real_model_floors.py")
floors = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(floors)


def test_kv_bytes_per_token_of_smollm2_135m():
    cfg = TransformerConfig(vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
                            head_dim=64, mlp_hidden_size=1536)
    assert floors.kv_bytes_per_token(cfg) == 2 * 30 * 3 * 64 * 4 == 46080  # K and V, float32, all layers


def test_decode_step_context_counts_prompts_once_per_sample_and_the_tokens_so_far():
    # 2 prompts of 3 and 5 tokens, 2 samples each: 16 prompt positions over 4 rows; step k adds k per row
    np.testing.assert_array_equal(floors.decode_step_context(np.array([3, 5]), 2, 4), [20, 24, 28])


def test_rollout_floor_by_hand():
    f = floors.rollout_floor(weight_bytes=100, kv_bytes=10, context=np.array([1, 2]), step_flops=np.array([50, 1500]),
                             prefill_flops=30, bandwidth=10, peak=100)
    # step bytes 110, 120 -> 11 s, 12 s; compute 0.5 s, 15 s; roofline 11 + 15; prefill max(100 / 10, 0.3)
    assert f == pytest.approx({"memory": 23.0, "compute": 15.5, "roofline": 26.0, "prefill": 10.0, "total": 36.0,
                               "steps": 2.0})


def test_decode_step_flops_sum_to_the_bench_count_of_the_decode():
    cfg = preset("tiny", vocab_size=50)
    prompt, group, new = np.array([3, 6]), 2, 5
    steps = floors.decode_step_flops(cfg, prompt, group, new)
    assert len(steps) == new - 1 and np.all(np.diff(steps) > 0)  # each step attends over one more position
    decode = sampling_flops(cfg, prompt, np.full(len(prompt) * group, new), group) - prefill_flops(cfg, prompt)
    assert steps.sum() == pytest.approx(decode)


def test_the_smollm2_bench_preset_needs_the_model_folder():
    from rl_core.config import ConfigError
    from trainer.bench.measure import run_bench

    with pytest.raises(ConfigError, match="--preset smollm2-135m needs --model DIR"):
        run_bench(preset="smollm2-135m", log=lambda _: None)
