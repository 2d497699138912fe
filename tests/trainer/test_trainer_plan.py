"""`trainer plan`: per-device memory from compiled programs on abstract shapes, next to a count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from flax import nnx
from rl_models import Transformer
from rl_models.hf import load_hf_config

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"


@pytest.mark.parametrize(
    ("name", "billions", "tied"),
    [("qwen2.5-1.5b", 1.544, True), ("qwen2.5-7b", 7.616, False)],
)
def test_the_readme_models_are_the_published_shapes(name, billions, tied):
    """The plan figures in the README use these config.json files (read without weights)."""
    config = load_hf_config(CONFIGS / name)
    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    count = sum(x.size for x in jax.tree.leaves(nnx.state(abstract)))
    assert config.tie_embeddings is tied and config.attention_bias
    assert abs(count / 1e9 - billions) < 0.001, count  # Qwen2.5-1.5B: 1,543,714,304; 7B: 7,615,616,512


def plan_json(*args: str) -> dict:
    env = dict(os.environ)
    # the suite's XLA_FLAGS stay (faster compiles); plan sets the simulated device count itself
    out = subprocess.run(
        [sys.executable, "-m", "trainer.cli", "plan", "--json", *args],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout)


@pytest.mark.slow
def test_plan_on_8_devices_agrees_with_the_count_and_says_whether_it_fits():
    """Tiny preset, AdamW, GRPO with its reference model and the paged engine, on fsdp=4 x tensor=2."""
    common = ["--preset", "tiny", "--devices", "8", "training.mesh.fsdp=4", "training.mesh.tensor=2",
              "training.prompts_per_step=4", "algorithm.group_size=4", "training.micro_batch_size=8",
              "rollout.engine=paged"]
    result = plan_json(*common, "--device-memory-gb", "80")
    compiled, analytic = result["compiled"], result["analytic"]
    assert result["mesh"] == {"data": 1, "fsdp": 4, "tensor": 2}
    # float32 parameters and two AdamW moments per device, exactly as the shards add up
    assert compiled["parameters_and_optimizer_state"] == analytic["parameters"] + analytic["optimizer_state"]
    # two float32 moments per parameter, plus AdamW's step counters (int32 scalars, replicated)
    assert 0 < analytic["optimizer_state"] - 2 * analytic["parameters"] <= 16
    # float32 bytes: the seven stacked kernels (294,912) split 8 ways; embed and lm_head
    # (99 x 64 each, 25,344) only 4 ways, as 99 rows do not split over tensor=2; the norms
    # (1,280) whole: 36,864 + 12,672 + 1,280 = 50,816 of 346,880
    assert 4 * result["parameters"] == 346_880
    assert analytic["parameters"] == 294_912 // 8 + 2 * 25_344 // 4 + 1_280 == 50_816
    assert compiled["reference"] == analytic["reference"] == analytic["parameters"]  # float32 storage
    assert compiled["update_temporaries"] >= analytic["gradients"]  # gradients live in the update
    assert compiled["rollout_temporaries"] >= analytic["kv_cache"] > 0
    # the engine: 4 replicas (one per fsdp device) of 4 slots (16 completions / 4), kv heads split
    # over tensor=2 (256 bytes of keys and values per token per device); a sequence fits one 16-token
    # page, so a replica's pool is 1 scratch + 4 slots x (1 + 1 lookahead) + 4 waiting prompts' pages
    assert analytic["engine_kv_pool"] == (1 + 4 * 2 + 4) * 16 * 256
    # in use at the mean (= max_new_tokens): 1 prompt per replica, its 4 completions 2 pages each
    assert analytic["engine_kv_in_use"] == (1 + 4 * 2) * 16 * 256
    assert result["fits"] and result["peak_bytes"] < 80 * 1024**3
    tight = plan_json(*common, "--device-memory-gb", str(result["peak_bytes"] / 2 / 1024**3))
    assert not tight["fits"] and tight["peak_bytes"] == result["peak_bytes"]


def test_a_mesh_that_does_not_fit_the_devices_fails_when_settings_are_built():
    from rl_core.config import ConfigError
    from trainer.settings import build_settings

    n = jax.device_count()
    with pytest.raises(ConfigError, match=f"needs a multiple of {n + 1} devices, but {n} are available"):
        build_settings(algo="grpo", overrides=[f"training.mesh.tensor={n + 1}"])


def test_plan_counts_the_paged_engine_pool_its_use_and_weight_copy():
    """Tiny preset (2 layers, 2 KV heads of 16, float32: 512 bytes of keys and values per token)."""
    from trainer.plan import plan
    from trainer.settings import build_settings

    settings = build_settings(algo="grpo", overrides=[
        "model.preset=tiny", "training.prompts_per_step=2", "algorithm.group_size=4", "rollout.engine=paged",
        "rollout.max_prompt_tokens=31", "rollout.max_new_tokens=32", "rollout.page_size_tokens=16",
    ])
    result = plan(settings, device_memory_gb=80, mean_new_tokens=10)
    a = result.analytic
    # 8 slots (the batch), 4 pages per sequence ((32 + 32) / 16): 1 scratch + 8 x (4 + 1) + 8 x 2 prompt pages
    assert a["engine_kv_pool"] == (1 + 8 * 5 + 8 * 2) * 16 * 512
    # in use at a mean of 10 new tokens: 2 prompts x 2 pages + 8 completions x (1 page + 1 partial)
    assert a["engine_kv_in_use"] == (2 * 2 + 8 * 2) * 16 * 512
    assert a["engine_weights"] == 4 * result.parameters  # the whole model in float32 on the one device
    assert "rollout engine (paged): KV page pool" in result.table()
    assert result.peak_bytes >= a["engine_kv_pool"] + a["engine_weights"]
