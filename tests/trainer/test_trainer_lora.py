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
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from safetensors.numpy import load_file

from rl_core.run.checkpoint import Checkpointer
from rl_core.config import ConfigError
from rl_models.hf import load_hf_model
from trainer.cli import main
from trainer.run import load_run_policy
from trainer.settings import build_settings
from tolerances import close
from host import backend as jax_backend
from plan_bytes import planned_parts, step_counters
from rl_core.rollout import argument_bytes, per_device

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
TINY_RANK8 = 16_384  # see tests/rl_models/test_models_lora.py for the count per projection
TINY_BASE = 86_720  # the tiny preset's parameters (346,880 float32 bytes)
TINY_LORA_A = 8_192  # of TINY_RANK8: A is [in, 8] per projection and layer, 4,096 per layer
PROJECTIONS = {"attn": ("k_proj", "o_proj", "q_proj", "v_proj"), "mlp": ("down_proj", "gate_proj", "up_proj")}
PEFT_MODULE = {"attn": "self_attn", "mlp": "mlp"}  # Hugging Face's module names


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


def checkpoint_tree(run_dir: Path, step: int) -> dict:
    """The checkpoint's own arrays tree as Orbax recorded it: key path -> (shape, dtype)."""
    path = (run_dir / "checkpoints" / str(step) / "arrays").absolute()
    tree = ocp.StandardCheckpointer().metadata(path).item_metadata.tree
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return {jax.tree_util.keystr(p, simple=True, separator="/"): (tuple(m.shape), m.dtype) for p, m in leaves}


def with_known_adapters(run_dir: Path, step: int) -> tuple[int, dict]:
    """Write checkpoint step + 1: checkpoint `step` with every lora_b set to a fixed nonzero pattern.

    A run from random weights ties every group, so its gradients are 0 and B stays at its
    initial 0: an export that dropped the adapters would look right. Returns (the new step,
    the adapters written, as NumPy arrays: lora_a as trained, lora_b the pattern)."""
    policy = load_run_policy(run_dir, step)  # only for the tree's structure; the values come from Orbax
    like = {"params": policy.params, "opt_state": policy.learner.state.policy.opt_state, "rng": policy.learner.state.rng}
    checkpointer = Checkpointer(run_dir / "checkpoints", max_to_keep=100)
    try:
        arrays, meta = checkpointer.restore(step, like=like)
        assert not any(np.any(np.asarray(b)) for p, b in jax.tree_util.tree_leaves_with_path(arrays["params"])
                       if "lora_b" in jax.tree_util.keystr(p))  # as trained: B = 0 (so the pattern matters)

        def known(path, x):
            if "lora_b" not in jax.tree_util.keystr(path):
                return np.asarray(x)
            phase = len(jax.tree_util.keystr(path))  # a different pattern per projection
            return (0.05 * np.cos(np.arange(x.size, dtype=np.float32) + phase)).reshape(x.shape)

        arrays["params"] = jax.tree_util.tree_map_with_path(known, arrays["params"])
        checkpointer.save(step + 1, arrays=arrays, meta={**meta, "step": step + 1})
    finally:
        checkpointer.close()
    return step + 1, arrays["params"]


def assert_peft_tensors_are(tensors: dict, adapters: dict, num_layers: int) -> None:
    """PEFT's lora_A [r, in] and lora_B [out, r] of every projection and layer are the
    transposes of the adapters' A [L, in, r] and B [L, r, out], and nothing else is in the file."""
    expected = {}
    for group, names in PROJECTIONS.items():
        for name in names:
            for layer in range(num_layers):
                stem = f"base_model.model.model.layers.{layer}.{PEFT_MODULE[group]}.{name}"
                pair = adapters["layers"][group][name]
                expected[f"{stem}.lora_A.weight"] = np.asarray(pair["lora_a"][layer]).T
                expected[f"{stem}.lora_B.weight"] = np.asarray(pair["lora_b"][layer]).T
    assert sorted(tensors) == sorted(expected)
    for key, want in expected.items():
        np.testing.assert_array_equal(tensors[key], want, err_msg=key)


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


@pytest.fixture(scope="module")
def adapted_run(lora_run):
    """`lora_run` plus checkpoint 3: checkpoint 2 with nonzero B (see `with_known_adapters`)."""
    step, adapters = with_known_adapters(lora_run, 2)
    return lora_run, step, adapters


@pytest.mark.e2e
def test_checkpoints_hold_only_the_adapters(lora_run):
    # the checkpoint's own keys, from Orbax's metadata (not the learner's tree it is restored into)
    stored = checkpoint_tree(lora_run, 2)
    adapters = {f"params/layers/{group}/{name}/lora_{ab}" for group, names in PROJECTIONS.items()
                for name in names for ab in "ab"}  # fmt: skip
    assert {k for k in stored if k.startswith("params/")} == adapters
    assert sum(np.prod(shape) for k, (shape, _) in stored.items() if k.startswith("params/")) == TINY_RANK8
    # AdamW's two moments of the adapters, two step counts and the RNG key: no base weight anywhere
    floats = {k: shape for k, (shape, dtype) in stored.items() if dtype == np.float32}
    assert sum(np.prod(shape) for shape in floats.values()) == 3 * TINY_RANK8
    assert all(k.rsplit("/", 1)[-1] in ("lora_a", "lora_b") for k in floats)
    assert {k for k, (_, dtype) in stored.items() if dtype != np.float32} == {
        "opt_state/1/0/count", "opt_state/1/2/count", "rng"}

    # and on disk: the array data (zstd-compressed chunks) holds at least A, whose random float32
    # values do not compress (B and the moments of a step without gradient are zeros, which do),
    # and less than the adapters with both moments uncompressed: the base would add 346,880 bytes.
    # Measured: 35.4 KB of data, 32,768 bytes of it A; 75.5 KB with Orbax's metadata files.
    data = sum(f.stat().st_size for f in (lora_run / "checkpoints" / "2" / "arrays").rglob("d/*") if f.is_file())
    assert 0.85 * 4 * TINY_LORA_A < data < 4 * 3 * TINY_RANK8 < 4 * TINY_BASE
    run = load_run_policy(lora_run, 2)  # and the learner restores it into its adapter-shaped tree
    assert sum(x.size for x in jax.tree.leaves(run.params)) == TINY_RANK8


@pytest.mark.e2e
def test_merged_export_reloads_with_the_adapted_logits_and_the_adapter_export_is_peft(adapted_run, tmp_path, capsys):
    run_dir, step, adapters = adapted_run
    assert main(["export", "--run", str(run_dir), "--out", str(tmp_path / "hf")]) == 0
    run = load_run_policy(run_dir)
    assert run.step == step
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, run.params), adapters)
    tokens = np.array([[1, 12, 13, 5, 20, 21]], np.int32)
    # the policy rebuilt from the known adapters (not from the export's own restore) and the base alone
    adapted = logits(nnx.merge(run.learner.policy.graphdef, adapters, run.learner.policy.frozen), tokens)
    base = logits(nnx.merge(run.learner.policy.graphdef, jax.tree.map(np.zeros_like, adapters), run.learner.policy.frozen), tokens)
    # the adapters' effect is visible (measured max |difference| 0.91 on logits up to 3.1),
    # and the merged export carries it: its logits are the adapted ones, not the base's
    assert np.abs(adapted - base).max() > 0.1
    np.testing.assert_allclose(logits(load_hf_model(tmp_path / "hf"), tokens), adapted, **close(atol=1e-5))

    capsys.readouterr()
    assert main(["export", "--run", str(run_dir), "--out", str(tmp_path / "adapter"), "--adapter"]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (8, 16.0, "LORA")
    tensors = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert sum(x.size for x in tensors.values()) == TINY_RANK8
    assert tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (8, 64)
    assert tensors["base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"].shape == (128, 8)
    assert_peft_tensors_are(tensors, adapters, num_layers=2)  # the checkpoint's values, B nonzero


@pytest.mark.e2e
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
    step, adapters = with_known_adapters(run, 1)  # B != 0, else an export without adapters would pass
    capsys.readouterr()
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "adapter"), "--adapter"]) == 0
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(FIXTURES / "qwen2")
    policy = load_run_policy(run)
    tensors = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert_peft_tensors_are(tensors, adapters, num_layers=len(adapters["layers"]["attn"]["q_proj"]["lora_a"]))
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert policy.step == step
    tokens = np.array([policy.tokenizer.encode("What is 2+2?")], np.int32)
    # the int8 base with the known adapters, and without them; the merged export (W dequantized
    # + (alpha / r) A B) must give the former: measured max |difference| from the base 0.47
    # on logits up to 1.26
    graphdef, frozen = policy.learner.policy.graphdef, policy.learner.policy.frozen
    adapted = logits(nnx.merge(graphdef, adapters, frozen), tokens)
    base = logits(nnx.merge(graphdef, jax.tree.map(np.zeros_like, adapters), frozen), tokens)
    assert np.abs(adapted - base).max() > 0.1
    np.testing.assert_allclose(logits(load_hf_model(tmp_path / "hf"), tokens), adapted, **close(atol=1e-5))


@pytest.mark.e2e
def test_plan_of_a_lora_run_counts_the_adapters_and_the_saved_reference():
    """PPO with a reference (beta 0.04): the policy's adapters and reference as any algorithm's, and a
    critic that trains its own adapters and a value head over the same frozen base."""
    result = plan_json("--preset", "tiny", "--algo", "ppo", "model.lora.rank=8", "training.prompts_per_step=4",
                       "algorithm.group_size=4", "algorithm.beta=0.04")
    compiled, analytic = result["compiled"], result["analytic"]
    assert result["trainable"] == TINY_RANK8 and result["parameters"] == 86_720 + TINY_RANK8
    assert analytic["parameters"] == 4 * TINY_RANK8  # float32 adapters
    settings = build_settings(algo="ppo", overrides=["model.preset=tiny", "model.lora.rank=8"])
    adapters, base = planned_parts(settings)  # compiled: as the compiler lays them out (XLA:CPU: dense)
    assert analytic["frozen_base"] == 4 * 86_720  # float32 storage, one copy for both models
    assert compiled["frozen_base"] == argument_bytes(base)
    assert analytic["reference"] == 4 * TINY_RANK8 and compiled["reference"] == argument_bytes(adapters)  # zero adapters
    if jax_backend() == "cpu":  # laid out dense: the hand counts
        assert (compiled["frozen_base"], compiled["reference"]) == (4 * 86_720, 4 * TINY_RANK8)
    assert analytic["reference_saved"] == 4 * 86_720 - 4 * TINY_RANK8
    critic = TINY_RANK8 + 65 + 320  # its own rank-8 adapters, a value head of D + 1, a confidence head of 5 x 64
    assert result["critic_trainable"] == critic and analytic["critic_parameters"] == 4 * critic
    # float32 adapters and head, two AdamW moments and two int32 step counters; no base of its own
    critic_adapters, _ = planned_parts(settings, critic=True)
    assert per_device(critic_adapters) == 4 * critic
    assert compiled["critic_parameters_and_optimizer_state"] == 3 * argument_bytes(critic_adapters) + argument_bytes(
        step_counters())
    assert jax_backend() != "cpu" or compiled["critic_parameters_and_optimizer_state"] == 3 * 4 * critic + 8


@pytest.mark.e2e
def test_bench_reports_a_lora_run(tmp_path):
    from trainer.bench.measure import run_bench

    results = run_bench(preset="tiny", steps=1, output=tmp_path / "b.json", overrides=["model.lora.rank=8"],
                        log=lambda _: None)
    assert results["lora"]["rank"] == 8
    memory = results["memory"]
    assert memory["trainable_parameters"] == TINY_RANK8 and memory["trained_bytes"] == 4 * TINY_RANK8
    assert memory["frozen_bytes"] == 4 * 86_720
    assert results["compile_count"]["timed_delta"] == 0
