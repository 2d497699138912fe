"""`trainer plan`: per-device memory from compiled programs on abstract shapes, next to a count;
the runtime's share of each device and a headroom; the weights as loaded; settings that fit."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import jax
import pytest
from flax import nnx
from rl_core.config import ConfigError
from rl_core.rollout.factory import resolve_engine
from rl_models import Transformer
from rl_models.hf import load_hf_config
from trainer.plan import GIB, memory_budget
from trainer.plan import Plan
from trainer.cli import main
from host import backend as jax_backend
from plan_bytes import planned_parts, step_counters
from rl_core.rollout import argument_bytes, per_device

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"


@pytest.mark.parametrize(
    ("name", "billions", "tied"),
    [("qwen2.5-1.5b", 1.544, True), ("qwen2.5-7b", 7.616, False)],
)
def test_the_readme_models_are_the_published_shapes(name, billions, tied):
    """The plan figures in docs/scaling.md and docs/lora.md use these config.json files (read without weights)."""
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


@pytest.mark.multidevice
def test_plan_on_8_devices_agrees_with_the_count_and_says_whether_it_fits():
    """Tiny preset, AdamW, GRPO with its reference model and the paged engine, on fsdp=4 x tensor=2."""
    common = ["--preset", "tiny", "--devices", "8", "training.mesh.fsdp=4", "training.mesh.tensor=2",
              "training.prompts_per_step=4", "algorithm.group_size=4", "training.micro_batch_size=8",
              "rollout.engine=paged", "model.remat=none"]  # set: at auto the tight budget below picks another
    result = plan_json(*common, "--device-memory-gb", "80")
    compiled, analytic = result["compiled"], result["analytic"]
    assert result["mesh"] == {"data": 1, "fsdp": 4, "expert": 1, "tensor": 2}
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
    assert compiled["rollout_temporaries"] is None and analytic["kv_cache"] > 0  # paged: no static sampler
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
        "rollout.max_prompt_tokens=31", "rollout.max_new_tokens=32", "rollout.options.page_size=16",
    ])
    result = plan(settings, memory_budget("gpu"), mean_new_tokens=10)
    a = result.analytic
    # 8 slots (the batch), 4 pages per sequence ((32 + 32) / 16): 1 scratch + 8 x (4 + 1) + 8 x 2 prompt pages
    assert a["engine_kv_pool"] == (1 + 8 * 5 + 8 * 2) * 16 * 512
    # in use at a mean of 10 new tokens: 2 prompts x 2 pages + 8 completions x (1 page + 1 partial)
    assert a["engine_kv_in_use"] == (2 * 2 + 8 * 2) * 16 * 512
    assert a["engine_weights"] == 4 * result.parameters  # the whole model in float32 on the one device
    assert "rollout engine (paged): KV page pool" in result.table()
    assert result.peak_bytes >= a["engine_kv_pool"] + a["engine_weights"]


def test_plan_counts_the_static_engines_bfloat16_weight_copy():
    """rollout.weights_dtype=bfloat16: the static engine samples with a bfloat16 copy of the whole
    float32 model, 2 bytes a parameter beside the trained weights; without it, no copy."""
    from trainer.plan import memory_budget, plan
    from trainer.settings import build_settings

    base = ["model.preset=tiny", "training.prompts_per_step=2", "algorithm.group_size=4", "rollout.engine=static"]
    cast = plan(build_settings(algo="grpo", overrides=[*base, "rollout.weights_dtype=bfloat16"]), memory_budget("gpu"))
    same = plan(build_settings(algo="grpo", overrides=base), memory_budget("gpu"))
    assert cast.analytic["rollout_weight_copy"] == 2 * cast.parameters and same.analytic["rollout_weight_copy"] == 0
    assert "rollout: weight copy in rollout.weights_dtype" in cast.table()
    assert "weight copy" not in same.table()
    copy = cast.analytic["rollout_weight_copy"]
    assert cast.program_bytes["rollout"] == cast.compiled["rollout_temporaries"] + copy


def test_the_memory_a_run_may_plan_for_on_each_platform():
    """GPU: JAX preallocates 75% (XLA_CLIENT_MEM_FRACTION or the older XLA_PYTHON_CLIENT_MEM_FRACTION
    changes it; --memory-fraction wins); TPU: a v5e chip's allocator limit, all usable; CPU: all. A plan
    fits under (1 - headroom) of that."""
    gpu = memory_budget("gpu", environ={})
    assert (gpu.device_memory_bytes, gpu.fraction, gpu.usable_bytes) == (80 * GIB, 0.75, 60 * GIB)
    assert gpu.limit_bytes == int(60 * GIB * 0.9) and "XLA_CLIENT_MEM_FRACTION changes it" in gpu.fraction_source
    assert memory_budget("gpu", environ={"XLA_PYTHON_CLIENT_MEM_FRACTION": ".9"}).fraction == 0.9
    set_here = memory_budget("gpu", environ={"XLA_CLIENT_MEM_FRACTION": ".95"})
    assert (set_here.fraction, set_here.fraction_source) == (0.95, "XLA_CLIENT_MEM_FRACTION=.95")
    assert memory_budget("gpu", fraction=0.5, environ={"XLA_CLIENT_MEM_FRACTION": ".95"}).fraction == 0.5
    with pytest.raises(ConfigError, match="XLA_CLIENT_MEM_FRACTION and XLA_PYTHON_CLIENT_MEM_FRACTION are both set"):
        memory_budget("gpu", environ={"XLA_CLIENT_MEM_FRACTION": ".9", "XLA_PYTHON_CLIENT_MEM_FRACTION": ".9"})
    tpu = memory_budget("tpu")  # a v5e chip's allocator limit, all of it (test_plan_tpu_compile.py: per slice)
    assert (tpu.device_memory_bytes, tpu.fraction) == (int(15.75 * GIB), 1.0)
    cpu = memory_budget("cpu", device_memory_gb=8, headroom=0)
    assert cpu.limit_bytes == cpu.usable_bytes == 8 * GIB
    for bad, match in [(dict(headroom=1.0), "--headroom = 1.0"), (dict(fraction=0.0), "must be in \\(0, 1\\]"),
                       (dict(device_memory_gb=-1.0), "--device-memory-gb = -1.0")]:
        with pytest.raises(ConfigError, match=match):
            memory_budget("gpu", **bad)


def made_up_plan(budget, *, resident_gib, update_gib, loaded_gib=0.0, loaded="freed") -> Plan:
    gib = lambda x: int(x * GIB)  # noqa: E731
    compiled = {"parameters_and_optimizer_state": gib(resident_gib), "frozen_base": 0, "reference": 0,
                "update_temporaries": gib(update_gib), "rollout_temporaries": 0, "reference_temporaries": None}
    return Plan("m", {"data": 1, "fsdp": 1, "tensor": 1}, 1, 1, compiled, {"loaded_model": gib(loaded_gib)}, budget,
                loaded_model=loaded)


def test_fits_means_under_the_runtimes_share_less_the_headroom():
    """15.4 GiB on a v5e chip: 15.75 GiB usable (its allocator's limit), 15.75 x 0.9 = 14.175 with 10% headroom
    (printed 14.17: the bytes are whole): it does not fit; with no headroom it does, 0.35 GiB to spare."""
    tight = made_up_plan(memory_budget("tpu"), resident_gib=10.0, update_gib=5.4)
    assert tight.peak_bytes == int(10.0 * GIB) + int(5.4 * GIB) and not tight.fits
    assert tight.verdict() == "does NOT fit: peak 15.40 GiB is 1.22 GiB over the 14.17 GiB limit"
    roomy = made_up_plan(memory_budget("tpu", headroom=0.0), resident_gib=10.0, update_gib=5.4)
    assert roomy.fits and roomy.verdict() == "fits: peak 15.40 of 15.75 GiB (margin 0.35 GiB)"


def test_the_weights_as_loaded_count_at_startup_when_freed_and_as_the_reference_when_kept():
    """beta = 0: the loaded copy (here 3 GiB) is gone before any program runs, but it sits beside
    the masters while the learner is built: a startup peak. beta != 0: it is the reference."""
    budget = memory_budget("cpu", device_memory_gb=20, headroom=0)
    freed = made_up_plan(budget, resident_gib=17.0, update_gib=1.0, loaded_gib=3.0)
    assert freed.startup_bytes == int(20.0 * GIB) and freed.peak_bytes == freed.startup_bytes
    kept = made_up_plan(budget, resident_gib=17.0, update_gib=1.0, loaded_gib=3.0, loaded="reference")
    assert kept.startup_bytes == kept.resident_bytes and kept.peak_bytes == int(18.0 * GIB)


@pytest.mark.e2e
def test_with_beta_0_the_trainer_frees_the_weights_as_loaded_once_the_learner_is_built(monkeypatch, tmp_path):
    """What the plan's "freed" rests on: after trainer.run builds the learner, no reference to the
    loaded model's arrays is left (the learner, the rollout engine and the sampler keep none);
    with beta > 0 they stay, as the reference policy."""
    from trainer import build
    from trainer.run import train as run
    from trainer.settings import build_settings

    loaded: list[weakref.ref] = []
    new_model = build.new_model

    def recording_new_model(settings, tokenizer):
        model = new_model(settings, tokenizer)
        loaded.extend(weakref.ref(v[...]) for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))
        return model

    class Built(Exception):
        pass

    alive: dict[str, int] = {}

    def count_alive_then_stop(learner, *args, **kwargs):  # the first thing after `del model, policy`
        gc.collect()
        alive[f"{learner._config.beta}-{resolve_engine(learner.rollout)}"] = sum(r() is not None for r in loaded)
        raise Built

    monkeypatch.setattr(build, "new_model", recording_new_model)
    monkeypatch.setattr(run, "base_evaluation", count_alive_then_stop)
    for i, extra in enumerate(["algorithm.beta=0", "algorithm.beta=0 rollout.engine=paged", "algorithm.beta=0.04"]):
        loaded.clear()
        settings = build_settings(algo="grpo", overrides=[
            "model.preset=tiny", "model.param_dtype=bfloat16", "warm_start.steps=0", "training.num_steps=1",
            *extra.split()])
        with pytest.raises(Built):
            run.train_run(settings, tmp_path / str(i), progress=False, log=lambda _: None)
        assert len(loaded) == 12  # the tiny model's parameter arrays
    assert alive == {"0.0-static": 0, "0.0-paged": 0, "0.04-static": 12}


def test_plan_says_where_the_weights_as_loaded_go():
    from trainer.plan import plan
    from trainer.settings import build_settings

    common = ["model.preset=tiny", "training.prompts_per_step=2", "algorithm.group_size=2", "rollout.engine=paged"]
    dapo = plan(build_settings(algo="dapo", overrides=common), memory_budget("cpu"))
    assert dapo.loaded_model == "freed" and dapo.compiled["reference_temporaries"] is None  # no reference pass
    assert dapo.analytic["loaded_model"] == dapo.parameters * 4  # float32, one device
    assert dapo.startup_bytes == dapo.resident_bytes + dapo.analytic["loaded_model"]
    assert "freed once the learner has its float32 copy" in dapo.table()
    settings = build_settings(algo="grpo", overrides=common)
    grpo = plan(settings, memory_budget("cpu"))
    assert grpo.loaded_model == "reference" and grpo.startup_bytes == grpo.resident_bytes
    weights, _ = planned_parts(settings)  # the reference is the model as loaded (float32), as laid out
    assert grpo.analytic["loaded_model"] == per_device(weights)
    assert grpo.compiled["reference"] == argument_bytes(weights)
    assert jax_backend() != "cpu" or grpo.compiled["reference"] == grpo.analytic["loaded_model"]  # dense there


def test_the_search_tries_the_cheapest_changes_first():
    """Training side: the fused kernel, then remat policies by recomputation, then halved
    micro-batches; rollout side: the paged engine, then halved decode slots (from the 32 a
    replica can use: 8 prompts x 4 completions on one device)."""
    import dataclasses

    from trainer.plan.search import micro_batches, rollout_candidates, training_candidates
    from trainer.settings import build_settings

    settings = build_settings(algo="grpo", overrides=[
        "model.preset=tiny", "model.dtype=bfloat16", "model.attention=xla", "training.prompts_per_step=8",
        "algorithm.group_size=4", "training.micro_batch_size=8", "model.remat=none"])
    base = dataclasses.replace(made_up_plan(memory_budget("gpu"), resident_gib=1, update_gib=1), attention="xla",
                               auto_attention="cudnn")
    auto = "model.attention=auto"
    assert micro_batches(settings) == [8, 4, 2, 1]
    assert list(training_candidates(base, settings))[:6] == [
        (auto,), (auto, "model.remat=dots_saveable"), (auto, "model.remat=dots_with_no_batch_dims_saveable"),
        (auto, "model.remat=full"), (auto, "training.micro_batch_size=4"),
        (auto, "model.remat=dots_saveable", "training.micro_batch_size=4"),
    ]
    assert list(rollout_candidates(settings)) == [
        ("rollout.engine=paged",), *(("rollout.engine=paged", f"rollout.options.slots={n}") for n in (16, 8, 4, 2, 1))]


@pytest.mark.e2e
def test_qwen2_5_7b_on_8_gpus_at_16k_tokens_per_row_finds_settings_that_fit_80_gb():
    """docs/scaling.md's 7B run (fsdp=8, bfloat16, 32 prompts x 8, micro-batches of 16) at 1024 + 15360
    tokens per row, with remat none it does not fit: no remat keeps every layer's activations
    (hundreds of GiB). The search names a remat policy and, the paged engine's pool then being the
    largest program, fewer decode slots, and the plan of both fits 80 GB under JAX's 75% with 10%
    headroom. DAPO (beta = 0, no reference pass) and the paged engine keep the compiles to the
    update's."""
    result = plan_json(
        "--algo", "dapo", "--model", str(CONFIGS / "qwen2.5-7b"), "--devices", "8", "--platform", "gpu",
        "training.mesh.fsdp=8", "model.dtype=bfloat16", "model.param_dtype=bfloat16", "training.prompts_per_step=32",
        "training.micro_batch_size=16", "algorithm.group_size=8", "rollout.max_prompt_tokens=1024",
        "rollout.max_new_tokens=15360", "rollout.engine=paged", "model.remat=none",  # as set: the search, not the pick
    )
    assert result["attention"] == "cudnn" and result["budget"]["limit_bytes"] == int(80 * GIB * 0.75 * 0.9)
    assert not result["fits"] and result["peak_bytes"] > 100 * GIB
    fit = result["fit"]
    assert fit is not None and fit["plan"]["fits"], result
    overrides = dict(o.split("=") for o in fit["overrides"])
    assert overrides["model.remat"] in ("dots_with_no_batch_dims_saveable", "full")
    assert fit["plan"]["peak_bytes"] <= fit["plan"]["budget"]["limit_bytes"]


TINY_PARAMETERS, TINY_LM_HEAD = 86_720, 99 * 64
"""The tiny preset's parameters and its unembedding (vocabulary 99 x D 64)."""


def test_plan_of_ppo_adds_the_critics_exact_bytes():
    """PPO against GRPO at the same batch (4 prompts x 2) and beta = 0: the policy's programs are the
    same (compiled once, shared), and the plan grows by exactly the critic's float32 parameters and
    its two AdamW moments (plus two int32 step counters), resident, and its two programs. (A LoRA
    critic: tests/trainer/test_trainer_lora.py.)"""
    from trainer.plan import plan
    from trainer.settings import build_settings

    # 80,769: the backbone, a value head of D + 1 and a confidence head of (3 + 1 + 1) x 64
    critic_trains = TINY_PARAMETERS - TINY_LM_HEAD + 65 + 320
    common = ["model.preset=tiny", "training.prompts_per_step=4", "algorithm.group_size=2", "algorithm.beta=0.0"]
    programs: dict = {}
    settings = build_settings(algo="ppo", overrides=common)
    ppo = plan(settings, memory_budget("gpu"), compiled_programs=programs)
    grpo = plan(build_settings(algo="grpo", overrides=common), memory_budget("gpu"), compiled_programs=programs)
    a, c = ppo.analytic, ppo.compiled
    assert grpo.critic_trainable == 0 and "critic_update" not in grpo.program_bytes
    assert ppo.critic_trainable == critic_trains
    assert a["critic_parameters"] == a["critic_gradients"] == 4 * critic_trains
    assert a["critic_optimizer_state"] == 2 * 4 * critic_trains + 8
    # compiled: the same arrays as the compiler lays them out (on XLA:CPU, the same bytes)
    critic, _ = planned_parts(settings, critic=True)
    critic_state = 3 * argument_bytes(critic) + argument_bytes(step_counters())
    assert c["critic_parameters_and_optimizer_state"] == critic_state
    assert jax_backend() != "cpu" or critic_state == 3 * 4 * critic_trains + 8  # the hand count, dense there
    # the policy's part is GRPO's, and the critic adds its own state only
    for key in ("parameters_and_optimizer_state", "frozen_base", "update_temporaries", "rollout_temporaries"):
        assert c[key] == grpo.compiled[key], key
    assert ppo.resident_bytes == grpo.resident_bytes + critic_state
    assert ppo.startup_bytes == grpo.startup_bytes + critic_state  # it shares the loaded weights
    # its update holds at least its gradients (read from XLA:CPU's memory analysis: XLA:TPU counts other, often
    # no, temporary bytes for a tiny program); its values pass, one micro-batch's forward
    if jax_backend() == "cpu":
        assert c["critic_update_temporaries"] >= a["critic_gradients"]
    assert c["critic_values_temporaries"] > 0
    assert ppo.program_bytes["critic_update"] == c["critic_update_temporaries"]
    assert ppo.peak_bytes >= ppo.resident_bytes + c["critic_update_temporaries"]
    assert f"critic: {critic_trains:,} trained" in ppo.table() and "critic: values pass temporaries" in ppo.table()


def test_plan_refuses_a_critic_folder_with_another_vocabulary_before_compiling(capsys):
    from trainer.cli import main

    code = main(["plan", "--algo", "ppo", "--preset", "tiny", "model.critic_path=tests/fixtures/hf/qwen2"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "its vocabulary has 320 tokens and the policy's 99; the critic reads the policy's tokens" in err


@pytest.mark.e2e  # compiles the hybrid model's update (half a minute on the shared 2 cores)
def test_plan_of_qwen3_5_counts_the_attention_layers_kv_and_the_fixed_linear_state():
    """The committed tiny Qwen3.5 (3 linear-attention layers, 1 attention layer, float32). Per
    sequence, each linear-attention layer keeps the convolution's last 3 inputs of 128 channels and
    a 16 x 16 state for each of 4 value heads: (3 * 128 + 4 * 256) * 4 bytes * 3 layers = 16,896
    bytes at any length; keys and values only for the one attention layer (2 heads of 32: 512
    bytes a token). The parameters are the folder's text model's (its vision tower is not read)."""
    from math import prod

    from safetensors import safe_open

    from rl_core.rollout.paged import EngineSettings
    from trainer.plan import plan
    from trainer.settings import build_settings

    folder = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen35"
    settings = build_settings(algo="grpo", overrides=[f"model.path={folder}", "training.prompts_per_step=2",
                                                      "algorithm.group_size=4"])
    result = plan(settings, memory_budget("gpu"))
    a = result.analytic
    assert result.engine == "static"  # "auto" below 512 new tokens
    assert a["recurrent_state"] == 8 * 16_896
    kv = a["kv_cache"] - a["recurrent_state"]
    assert kv > 0 and kv % (8 * 512) == 0  # 8 rows of whole tokens of the one attention layer
    assert "of which linear-attention state" in result.table()
    with safe_open(folder / "model.safetensors", framework="np") as f:
        text = sum(prod(f.get_slice(k).get_shape()) for k in f.keys() if not k.startswith("model.visual"))
    assert result.parameters == text
    # the paged engine: a KV pool of the attention layer only, and a state row per sequence it may hold
    settings = build_settings(algo="grpo", overrides=[f"model.path={folder}", "training.prompts_per_step=2",
                                                      "algorithm.group_size=4", "rollout.engine=paged"])
    result = plan(settings, memory_budget("gpu"))
    a = result.analytic
    engine = EngineSettings.from_rollout(settings.rollout, batch_size=8)
    assert engine.state_pool_rows == 2 * 8 + 2  # a scratch row, 8 slots' and as many more (prompts, sessions)
    assert a["engine_state_pool"] == engine.state_pool_rows * 16_896
    assert a["engine_kv_pool"] == engine.pool_pages * engine.page_size * 512
    assert "linear-attention state rows" in result.table()


@pytest.mark.e2e
def test_plan_takes_a_file_tasks_data_as_train_does(tmp_path, capsys):
    """`trainer plan --task gsm8k --data FILE`, the flag the file task's error names."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "What is 2 + 3?", "answer": "#### 5"}\n{"question": "What is 4 + 4?", "answer": "#### 8"}\n')
    base = ["plan", "--task", "gsm8k", "--model", "tests/fixtures/hf/qwen2", "--platform", "cpu", "--no-search"]
    assert main(base) == 2
    assert "pass --data FILE" in capsys.readouterr().err
    assert main([*base, "--data", str(data), "task.options.heldout_size=1"]) == 0
    assert "fits: peak" in capsys.readouterr().out


@pytest.mark.e2e  # compiles the update twice
def test_plan_of_a_model_whose_every_layer_is_windowed_counts_a_windows_pages_in_use():
    """The tiny Mistral (every layer a 5-slot window) on the paged engine with 4-token pages: a
    decoding sample holds at most (5 - 1) // 4 + 2 = 3 pages of its own, so the pool's use at the
    mean does not grow with the completion's length past the window; the pool (sized for full
    sequences) does, and the static sampler's KV (a ring of the window per layer) does not."""
    from trainer.plan import plan
    from trainer.settings import build_settings

    folder = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "mistral"

    def analytic(new_tokens):
        settings = build_settings(algo="grpo", overrides=[
            f"model.path={folder}", "training.prompts_per_step=1", "algorithm.group_size=2", "rollout.engine=paged",
            "rollout.options.page_size=4", f"rollout.max_new_tokens={new_tokens}"])
        return plan(settings, memory_budget("gpu")).analytic

    short, long = analytic(32), analytic(64)
    assert short["engine_kv_in_use"] == long["engine_kv_in_use"]
    assert long["engine_kv_pool"] > short["engine_kv_pool"]
    assert long["kv_cache"] == short["kv_cache"]  # the static sampler: a 5-slot ring per layer (rl_models.rings)
    token = 2 * 2 * 2 * 16 * 4  # keys and values, 2 layers, 2 kv heads of 16, float32
    prompt = short["engine_kv_in_use"] - 2 * 3 * 4 * token  # 2 samples, 3 pages of 4 tokens each
    assert prompt > 0 and prompt % (4 * token) == 0  # the prompt's whole pages


@pytest.mark.e2e  # compiles the update
def test_plan_of_a_mixed_windowed_and_global_model_counts_window_sized_rings_on_the_paged_engine():
    """The tiny Gemma 3 (5 layers with a 4-slot window, 1 global; 2 kv heads of 16, float32) on the
    paged engine: the page pool holds the global layer only, at full length; the windowed layers
    take a ring of 4 slots per state row, whatever the length; in use, one ring per prompt and
    per completion beside the global layer's pages."""
    from rl_core.rollout.paged import EngineSettings
    from trainer.plan import plan
    from trainer.settings import build_settings

    folder = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "gemma3_text"
    settings = build_settings(algo="grpo", overrides=[
        f"model.path={folder}", "training.prompts_per_step=1", "algorithm.group_size=2", "rollout.engine=paged",
        "rollout.options.page_size=4", "rollout.max_new_tokens=32"])
    result = plan(settings, memory_budget("gpu"))
    a = result.analytic
    engine = EngineSettings.from_rollout(settings.rollout, batch_size=2)
    token = 2 * 2 * 16 * 4  # keys and values of one layer: 2 kv heads of 16, float32
    assert a["engine_kv_pool"] == engine.pool_pages * 4 * token  # the global layer's pages only
    assert a["engine_ring_pool"] == engine.state_pool_rows * 4 * 5 * token  # 4 slots of 5 windowed layers a row
    prompt_pages = -(-settings.rollout.max_prompt_tokens // 4)
    assert a["engine_kv_in_use"] == (prompt_pages + 2 * (32 // 4 + 1)) * 4 * token + (1 + 2) * 4 * 5 * token
    assert "rollout engine (paged): 4-slot KV rings" in result.table()


@pytest.mark.e2e  # compiles the update and the sampler twice
def test_plan_counts_the_static_samplers_windowed_layers_at_their_window():
    """The tiny Gemma 3 (five 4-slot windowed layers to one global; 2 KV heads of 16, float32) on the
    static sampler, 2 rows of 64 + T tokens (the 64-token prompt, its BOS among them as a run encodes
    it): the count holds 5 x 4 + 1 x (64 + T) slots per row (rl_models.rings); 192 more new tokens grow the sampler's
    compiled program (cache included) by less than they would grow a full-length cache of every
    layer (6 x 192 slots per row)."""
    from trainer.plan import plan
    from trainer.settings import build_settings

    folder = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "gemma3_text"

    def planned(new_tokens):
        settings = build_settings(algo="grpo", overrides=[
            f"model.path={folder}", "training.prompts_per_step=1", "algorithm.group_size=2", "rollout.engine=static",
            "rollout.max_prompt_tokens=64", f"rollout.max_new_tokens={new_tokens}"])
        return plan(settings, memory_budget("gpu"))

    short, long = planned(64), planned(256)
    slot = 2 * 2 * 16 * 4  # keys and values of 2 heads of 16, float32
    assert short.analytic["kv_cache"] == 2 * (5 * 4 + 128) * slot
    assert long.analytic["kv_cache"] - short.analytic["kv_cache"] == 2 * 192 * slot  # the global layer's only
    grown = long.compiled["rollout_temporaries"] - short.compiled["rollout_temporaries"]
    assert 0 < grown < 2 * 6 * 192 * slot



def test_plan_for_tpu_counts_the_lane_packed_pool():
    """On a TPU the paged pool keeps a token's kv heads in 128-lane groups (rl_core.rollout.attention):
    the tiny preset's 2 kv heads of 16 share one group of 128 lanes, 2 layers x (k, v) x 128 x 4
    bytes = 2048 bytes a token where the CPU's pool holds 512."""
    from trainer.plan import plan
    from trainer.settings import build_settings

    settings = build_settings(algo="grpo", overrides=[
        "model.preset=tiny", "training.prompts_per_step=2", "algorithm.group_size=4", "rollout.engine=paged",
        "rollout.max_prompt_tokens=31", "rollout.max_new_tokens=32", "rollout.options.page_size=16",
    ])
    pool_pages = (1 + 8 * 5 + 8 * 2) * 16  # as the GPU plan above counts them
    assert plan(settings, memory_budget("tpu"), mean_new_tokens=10).analytic["engine_kv_pool"] == pool_pages * 2048
    assert plan(settings, memory_budget("gpu"), mean_new_tokens=10).analytic["engine_kv_pool"] == pool_pages * 512
