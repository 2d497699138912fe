"""LoRA runs through the trainer: settings, `trainer train model.lora.rank=8` on the built-in
task and on a model folder, adapter-only checkpoints, merged and PEFT exports, plan and bench."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from rl_core.config import ConfigError
from rl_models.hf import load_hf_model
from trainer.cli import main
from trainer.run_policy import load_run_policy
from trainer.settings import build_settings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
TINY_RANK8 = 16_384  # see tests/rl_models/test_models_lora.py for the count per projection


def plan_json(*args: str) -> dict:
    env = dict(os.environ)
    # the suite's XLA_FLAGS stay (faster compiles); plan sets the simulated device count itself
    out = subprocess.run([sys.executable, "-m", "trainer.cli", "plan", "--json", *args],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout)


def logits(model, tokens):
    b, n = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(n), (b, n))
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool)), (b, n, n))
    hidden, _ = model(jnp.asarray(tokens), positions, causal)
    return np.asarray(model.logits(hidden))


def test_lora_settings_are_checked_when_built():
    settings = build_settings(overrides=["model.lora.rank=8", "model.lora.targets=[q_proj, v_proj]", "model.quantize=nf4"])
    assert settings.model.lora.targets == ("q_proj", "v_proj") and settings.model.lora.alpha == 16.0
    with pytest.raises(ConfigError, match="ModelSettings.quantize = 'int8': .*set model.lora.rank > 0"):
        build_settings(overrides=["model.quantize=int8"])
    with pytest.raises(ConfigError, match="ModelSettings.quantize = 'fp3': must be null or one of"):
        build_settings(overrides=["model.lora.rank=4", "model.quantize=fp3"])
    with pytest.raises(ConfigError, match="LoraSettings.rank = -1"):
        build_settings(overrides=["model.lora.rank=-1"])
    with pytest.raises(ConfigError, match="LoraSettings has no field 'rnk'; did you mean 'rank'"):
        build_settings(overrides=["model.lora.rnk=8"])


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """`trainer train --algo grpo model.lora.rank=8`: two steps (GRPO's beta 0.04: the reference
    pass runs), checkpoints at steps 1 and 2, no warm start."""
    run = tmp_path_factory.mktemp("lora") / "run"
    argv = [
        "train", "--algo", "grpo", "--output", str(run), "--no-progress", "model.lora.rank=8",
        "training.num_steps=2", "training.checkpoint_every_steps=1", "warm_start.steps=0",
        "training.learning_rate=0.05", "eval.heldout_size=16", "eval.samples_per_prompt=2", "eval.pass_k=1",
        "eval.every_steps=0", "training.prompts_per_step=4", "algorithm.group_size=2",
    ]  # fmt: skip
    assert main(argv) == 0
    return run


@pytest.mark.slow
def test_checkpoints_hold_only_the_adapters(lora_run):
    run = load_run_policy(lora_run)  # restores the checkpoint into the learner's adapter-shaped tree
    assert sum(x.size for x in jax.tree.leaves(run.params)) == TINY_RANK8
    stored = sum(f.stat().st_size for f in (lora_run / "checkpoints" / "2").rglob("*") if f.is_file())
    base_bytes = sum(x.nbytes for x in jax.tree.leaves(run.learner.frozen))
    assert stored < base_bytes  # the base (346,880 float32 parameters) is not in it


@pytest.mark.slow
def test_merged_export_reloads_with_the_adapted_logits_and_the_adapter_export_is_peft(lora_run, tmp_path, capsys):
    assert main(["export", "--run", str(lora_run), "--out", str(tmp_path / "hf")]) == 0
    run = load_run_policy(lora_run)
    tokens = np.array([[1, 12, 13, 5, 20, 21]], np.int32)
    # (a random policy ties every group, so B may still be 0 here: merging with B != 0 is
    # tested on the model in tests/rl_models/test_models_lora.py)
    adapted = logits(run.model, tokens)
    np.testing.assert_allclose(logits(load_hf_model(tmp_path / "hf"), tokens), adapted, atol=1e-5)

    capsys.readouterr()
    assert main(["export", "--run", str(lora_run), "--out", str(tmp_path / "adapter"), "--adapter"]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (8, 16.0, "LORA")
    tensors = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert sum(x.size for x in tensors.values()) == TINY_RANK8
    assert tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (8, 64)
    assert tensors["base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"].shape == (128, 8)


@pytest.mark.slow
def test_qlora_on_a_model_folder(tmp_path, capsys):
    """`--model DIR` (the tiny committed Qwen2) with an int8 base and rank-8 adapters."""
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+1?", "answer": f"#### {a + 1}"}) + "\n" for a in range(6)))
    run = tmp_path / "run"
    argv = [
        "train", "--model", str(FIXTURES / "qwen2"), "--task", "gsm8k", "--data", str(data), "--algo", "grpo",
        "--output", str(run), "--no-progress", "model.lora.rank=8", "model.quantize=int8",
        "training.num_steps=1", "training.prompts_per_step=2", "algorithm.group_size=2",
        "task.options.heldout_size=2", "task.options.max_new_tokens=8",
        "eval.samples_per_prompt=2", "eval.pass_k=1", "eval.every_steps=0",
    ]  # fmt: skip
    assert main(argv) == 0
    assert json.loads((run / "summary.json").read_text())["skipped_updates"] == 0
    capsys.readouterr()
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "adapter"), "--adapter"]) == 0
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(FIXTURES / "qwen2")
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "hf")]) == 0
    policy = load_run_policy(run)
    tokens = np.array([policy.tokenizer.encode("What is 2+2?")], np.int32)
    np.testing.assert_allclose(logits(load_hf_model(tmp_path / "hf"), tokens), logits(policy.model, tokens), atol=1e-5)


@pytest.mark.slow
def test_plan_of_a_lora_run_counts_the_adapters_and_the_saved_reference():
    result = plan_json("--preset", "tiny", "model.lora.rank=8", "training.prompts_per_step=4", "algorithm.group_size=4")
    compiled, analytic = result["compiled"], result["analytic"]
    assert result["trainable"] == TINY_RANK8 and result["parameters"] == 86_720 + TINY_RANK8
    assert analytic["parameters"] == 4 * TINY_RANK8  # float32 adapters
    assert compiled["frozen_base"] == analytic["frozen_base"] == 4 * 86_720  # float32 storage, one copy
    assert compiled["reference"] == analytic["reference"] == 4 * TINY_RANK8  # zero adapters, not a base copy
    assert analytic["reference_saved"] == 4 * 86_720 - 4 * TINY_RANK8


@pytest.mark.slow
def test_bench_reports_a_lora_run(tmp_path):
    from trainer.bench import run_bench

    results = run_bench(preset="tiny", steps=1, output=tmp_path / "b.json", overrides=["model.lora.rank=8"],
                        log=lambda _: None)
    assert results["lora"]["rank"] == 8
    memory = results["memory"]
    assert memory["trainable_parameters"] == TINY_RANK8 and memory["trained_bytes"] == 4 * TINY_RANK8
    assert memory["frozen_bytes"] == 4 * 86_720
    assert results["compile_count"]["timed_delta"] == 0
