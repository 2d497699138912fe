"""`trainer plan --platform tpu`: the TPU compiler ahead of time where libtpu is importable (no chip
needed), else XLA:CPU's sizes with the update's temporaries calibrated (trainer.plan.tpu_compile)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from rl_core import ConfigError
from trainer.bench.memory_check import FIT_HEADROOM
from trainer.plan import GIB, MemoryBudget, Plan, memory_budget
from trainer.plan.device_memory import COMPILER_HEADROOM, tpu_chip_memory_gb
from trainer.plan.tpu_compile import CPU_OVER_TPU, calibrated, libtpu_importable, topology_name, tpu_compiler

from host import backend


@pytest.fixture
def no_chip():
    """These tests compile for a v5e ahead of time in a child process: the stand-in for a chip on a
    host that has none. On a TPU host this process holds the chip (and libtpu), and the chip's own
    compiles are what the rest of the suite runs."""
    if backend() != "cpu":
        pytest.skip(f"XLA:TPU ahead of time stands in for a chip, and this host has one ({backend()})")


def needs_libtpu(test):
    return pytest.mark.skipif(not libtpu_importable(), reason="libtpu is not installed (uv sync --extra tpu)")(
        pytest.mark.usefixtures("no_chip")(test))


def test_the_v5e_slice_of_each_chip_count():
    assert [topology_name(n) for n in (1, 4, 8, 16)] == ["v5e:1x1", "v5e:2x2", "v5e:2x4", "v5e:4x4"]
    with pytest.raises(ConfigError, match="a TPU v5e slice has 1, 4, 8, 16"):
        topology_name(3)


@pytest.mark.parametrize("chips", [1, 4, 8, 16])
def test_a_tpu_plan_by_default_counts_a_v5e_chips_allocator_limit_on_every_slice(chips):
    """Each chip of a v5e slice offers 15.75 GiB (its allocator's `bytes_limit`, the "available HBM (15.75G)"
    XLA:TPU compiles against), all of it usable. Less the 5% a plan compiled by XLA:TPU keeps, that is
    15.75 x 0.95 = 14.96 GiB: what `trainer bench` on the chip plans against (its device's free memory less
    the same 5%), so both pick the same settings."""
    budget = memory_budget("tpu", device_memory_gb=tpu_chip_memory_gb(chips), headroom=COMPILER_HEADROOM)
    assert (budget.device_memory_bytes, budget.fraction) == (int(15.75 * GIB), 1.0)
    assert round(budget.limit_bytes / GIB, 2) == 14.96
    on_the_chip = MemoryBudget("tpu", int(15.75 * GIB), 1.0, "tpu device, free of its allocator limit",
                               headroom=FIT_HEADROOM["tpu"])
    assert budget.limit_bytes == on_the_chip.limit_bytes
    assert memory_budget("tpu").device_memory_bytes == budget.device_memory_bytes  # with no --devices either


def test_a_tpu_plan_for_a_chip_count_no_v5e_slice_has_is_one_line(capsys):
    from trainer.cli import main

    assert main(["plan", "--platform", "tpu", "--devices", "3", "--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["trainer plan: error: --devices = 3: a TPU v5e slice has 1, 4, 8, 16, 32, 64, "
                                        "128, 256 chips"], err


def test_the_calibration_scales_the_update_temporaries_alone():
    """10 GiB of float32 weights and AdamW moments are the same on both compilers; 4.82 GiB of XLA:CPU
    update temporaries are 4.82 / 0.957 = 5.04 GiB on XLA:TPU."""
    compiled = {"parameters_and_optimizer_state": 10 * GIB, "frozen_base": 0, "reference": 0,
                "update_temporaries": int(4.82 * GIB), "rollout_temporaries": 0, "reference_temporaries": None}
    plan = Plan("m", {"data": 1, "fsdp": 1, "tensor": 1}, 1, 1, compiled, {"loaded_model": 0}, memory_budget("tpu"))
    scaled = calibrated(plan, CPU_OVER_TPU)
    assert scaled.resident_bytes == plan.resident_bytes == 10 * GIB
    assert CPU_OVER_TPU == 0.957 and scaled.program_bytes["update"] == int(int(4.82 * GIB) / 0.957)
    assert round(scaled.program_bytes["update"] / GIB, 2) == 5.04
    assert scaled.peak_bytes == 10 * GIB + int(int(4.82 * GIB) / CPU_OVER_TPU)


@pytest.mark.skipif(libtpu_importable(), reason="libtpu is installed: the TPU compiler is used, not the calibration")
def test_without_libtpu_a_tpu_plan_says_it_is_calibrated():
    compiler = tpu_compiler(1)
    assert compiler.devices is None and compiler.calibration == CPU_OVER_TPU and compiler.plan_options() == {}
    assert "calibrated" in compiler.description and "uv sync --extra tpu" in compiler.description


# the CPU backend stays JAX's default, libtpu only compiles; it may be loaded by another process already
# (this one's JAX, where the suite runs without JAX_PLATFORMS=cpu), which its lock file would refuse
ENV = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")


def _run(script: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=ENV, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


@needs_libtpu
def test_xla_tpu_compiles_for_a_v5e_with_no_chip_and_refuses_what_does_not_fit():
    """A 4096 x 4096 bfloat16 argument is 32 MiB on the chip. Two sorts of four 1 GiB float32 copies of a
    16384 x 16384 argument each need 17 GiB of temporaries: XLA:TPU refuses them as on a 15.75 GiB v5e."""
    out = _run("""
        import jax, jax.numpy as jnp
        from jax.sharding import SingleDeviceSharding
        from trainer.plan.refusal import ProgramRefused, refusals_as_verdicts
        from trainer.plan.tpu_compile import topology_devices
        (device,) = topology_devices(1)
        one = SingleDeviceSharding(device)
        x = jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16, sharding=one)
        stats = jax.jit(lambda a: a @ a).lower(x).compile().memory_analysis()
        print("kind", device.device_kind, "argument", stats.argument_size_in_bytes, "backend", jax.default_backend())
        big = jax.ShapeDtypeStruct((16384, 16384), jnp.float32, sharding=one)
        four = lambda a, k: jnp.concatenate([a + k, a * 2, a * 3, a * 4], axis=0).ravel()
        try:
            with refusals_as_verdicts("tpu"):
                jax.jit(lambda a: jnp.sort(four(a, 0))[:10] + jnp.sort(four(a, 1))[-10:]).lower(big).compile()
            print("compiled")
        except ProgramRefused as e:
            print("refused", e.verdict())
    """)
    assert "kind TPU v5 lite argument 33554432 backend cpu" in out, out
    assert "refused does NOT fit: the TPU compiler needs 17.00 GiB of temporaries, the device has 15.75 GiB" in out, out


@needs_libtpu
@pytest.mark.e2e  # compiles the tiny model's programs with XLA:TPU (about a minute on 2 cores)
def test_trainer_plan_for_tpu_compiles_with_xla_tpu_ahead_of_time():
    out = subprocess.run([sys.executable, "-m", "trainer.cli", "plan", "--preset", "tiny", "--platform", "tpu"],
                         env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "tpu: compiled ahead of time by XLA:TPU for v5e:1x1 (libtpu, no chip needed)" in out.stdout
    assert "memory: remat=none, micro_batch_size=whole mini-batch (picked: counted" in out.stdout
    assert "attention xla on tpu" in out.stdout and "fits: peak" in out.stdout  # its 13-token rows: under a Splash block


@needs_libtpu
def test_the_paged_engines_tpu_attention_compiles_for_a_v5e_at_every_head_dim():
    """Mosaic compiles (not only lowers) the paged engine's TPU attention ahead of time, at the 0.5B
    shape's pool (page 64, 17 pages a row, 256 rows) for head dims 64 (packed pairs, and SmolLM2's 3
    heads), 80, 96 and 128 (JAX's ragged kernel) and 256 (JAX's paged_attention: the ragged kernel's
    strided K/V load takes 128-lane rows only, which is what this test caught)."""
    out = _run("""
        import jax, jax.numpy as jnp
        from jax.sharding import SingleDeviceSharding
        from rl_core.rollout.ragged import RaggedKV
        from trainer.plan.tpu_compile import topology_devices
        (device,) = topology_devices(1)
        one = SingleDeviceSharding(device)
        kv = RaggedKV(64, 8)
        jax.set_mesh(jax.sharding.Mesh([device], ("chip",)))  # where Mosaic's lowering reads the chip's kind
        for heads, kv_heads, dh in [(14, 2, 64), (9, 3, 64), (8, 8, 80), (12, 4, 96), (6, 3, 128), (4, 2, 256)]:
            s = lambda shape, dtype=jnp.int32: jax.ShapeDtypeStruct(shape, dtype, sharding=one)
            pools = tuple(s(p.shape, jnp.bfloat16) for p in jax.eval_shape(lambda: kv.init(2, kv_heads, dh,
                                                                                            jnp.bfloat16, 600)))
            step = jax.jit(lambda q, k, v, pools, rows, pos: kv(q, k, v, pools, jnp.int32(1), rows, pos)[0])
            step.lower(s((256, heads, dh), jnp.bfloat16), s((256, kv_heads, dh), jnp.bfloat16),
                       s((256, kv_heads, dh), jnp.bfloat16), pools, s((256, 17)), s((256,))).compile()
            print("compiled", heads, kv_heads, dh, len(pools))
    """)
    assert out.count("compiled") == 6, out


@needs_libtpu
def test_the_paged_engines_tpu_step_copies_no_pool():
    """The paged engine's whole step (prefill chunk and decode, bfloat16, heads of 64 packed in pairs)
    compiled by XLA:TPU for a v5e ahead of time copies neither a layer of the pool (what slicing it out
    for JAX's paged_attention cost: 80 MB of keys and of values a layer at the 0.5B shape) nor the
    whole pool (what a pool whose second-minor axis was 2 cost: XLA moved that axis and copied the
    pool back for the kernel): no copy or dynamic-slice is as large as a layer of the pool."""
    out = _run("""
        import re
        import jax, numpy as np
        from flax import nnx
        from jax.sharding import Mesh, SingleDeviceSharding
        from rl_core.rollout.paged import EngineSettings, PagedBackend
        from rl_core.rollout.sampler import SamplingParams
        from rl_models import PAGED_TRANSFORMER, Transformer, TransformerConfig
        from rl_models.attention import traced_for
        from trainer.plan.tpu_compile import topology_devices
        (device,) = topology_devices(1)
        config = TransformerConfig.tiny(512, hidden_size=256, num_layers=2, num_heads=14, num_kv_heads=2,
                                        head_dim=64, mlp_hidden_size=512, dtype="bfloat16")
        with traced_for("tpu", kernels=True):
            graphdef, state = nnx.split(Transformer(config, rngs=nnx.Rngs(0)))
            settings = EngineSettings(slots=64, page_size=64, max_prompt_tokens=33, max_new_tokens=512,
                                      prefill_chunk=64, steps_per_sync=4)
            engine = PagedBackend(graphdef, settings, paging=PAGED_TRANSFORMER, eos_ids=(1,), pad_id=0,
                                  platform="tpu")
            engine.update_weights(state, 1)
            one = SingleDeviceSharding(device)
            engine.weights = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one),
                                          engine.weights)
            pool = jax.eval_shape(engine._init_pages)[0].shape
            sampling, key = SamplingParams(temperature=1.0), jax.random.key(0)
            with jax.set_mesh(Mesh([device], ("chip",))):
                text = engine.lower_step(sampling, key, platforms=("tpu",)).compile().as_text()
        layer = int(np.prod(pool[2:]))  # [R, L, P, rows, lanes]: one layer's elements
        sizes = [int(np.prod([int(d) for d in m.group(1).split(",")]))
                 for line in text.splitlines() if " copy(" in line or "dynamic-slice(" in line
                 for m in [re.search(r"= bf16\\[([0-9,]+)\\]", line)] if m]
        print("pool", pool, "layer", layer, "largest", max(sizes))
    """)
    pool_line = next(line for line in out.splitlines() if line.startswith("pool"))
    layer, largest = (int(x) for x in pool_line.split()[-3::2])
    assert largest < layer, pool_line


@needs_libtpu
@pytest.mark.e2e  # compiles the tiny model's programs with XLA:TPU
def test_a_tpu_plans_compiled_column_splits_the_arguments_as_xla_tpu_lays_them_out():
    """XLA:TPU pads each argument to its tiles: the tiny preset's 346,880 bytes of float32 weights take
    461,312 on a v5e. A plan's compiled column takes each program's inputs (and those it never reads)
    out of its argument size as laid out, so what is left is exactly the weights' laid-out bytes: the
    reference model, and PPO's critic with its two AdamW moments and two int32 step counters."""
    out = _run("""
        import sys
        sys.path.insert(0, "tests/support")
        import jax
        from plan_bytes import planned_parts, step_counters
        from rl_core.rollout import argument_bytes, per_device
        from trainer.plan import memory_budget, plan
        from trainer.plan.tpu_compile import topology_devices
        from trainer.settings import build_settings
        devices = topology_devices(1)
        one = jax.sharding.SingleDeviceSharding(devices[0])
        on_tpu = lambda t: jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one), t)
        common = ["model.preset=tiny", "training.prompts_per_step=4", "algorithm.group_size=2"]
        grpo = build_settings(algo="grpo", overrides=common)
        weights, _ = planned_parts(grpo)
        print("reference", plan(grpo, memory_budget("tpu"), devices=devices).compiled["reference"],
              argument_bytes(on_tpu(weights)), per_device(weights))
        ppo = build_settings(algo="ppo", overrides=common)
        critic, _ = planned_parts(ppo, critic=True)
        state = 3 * argument_bytes(on_tpu(critic)) + argument_bytes(on_tpu(step_counters()))
        print("critic", plan(ppo, memory_budget("tpu"), devices=devices).compiled["critic_parameters_and_optimizer_state"],
              state)
    """)
    assert "reference 461312 461312 346880" in out, out
    (critic,) = [line.split()[1:] for line in out.splitlines() if line.startswith("critic")]
    assert critic[0] == critic[1], out


@needs_libtpu
def test_the_static_decode_of_a_lane_packed_cache_compiled_for_a_v5e_copies_no_layer_of_it():
    """The static engine's sampler at the 0.5B shape's layer (896 wide, 14 query and 2 KV heads of 64,
    bfloat16; 2 layers, 128 rows x 288 slots) compiled by XLA:TPU for a v5e ahead of time: with the heads'
    layout [L, B, K, S, Dh] every decode step copies a layer of the cache into the attention's layout
    (what the 0.5B shape's profile on the chip showed); with the lane-packed cache
    (rl_models.block.LaneKV, keys rotated by rl_models.rope.rotate_lanes) no copy in the program is as
    large as a layer of the cache (a layer sliced out of the stack may change its layout within the slice's
    own fusion: one pass either way)."""
    out = _run("""
        import re
        import jax, jax.numpy as jnp, numpy as np
        from flax import nnx
        from rl_core import Sampler, SamplingParams
        from rl_core.runtime import mesh as mesh_lib
        from rl_models import Transformer, TransformerConfig
        from rl_models import attention as attention_lib
        from trainer.plan.tpu_compile import topology_devices
        config = TransformerConfig.tiny(99, hidden_size=896, num_layers=2, num_heads=14, num_kv_heads=2,
                                        mlp_hidden_size=4864, dtype="bfloat16", attention_bias=True)
        mesh = mesh_lib.make_mesh(devices=topology_devices(1))
        graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
        shardings = nnx.to_pure_dict(mesh_lib.param_shardings(state, mesh))
        state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                             nnx.to_pure_dict(state), shardings)
        prompts = jax.ShapeDtypeStruct((16, 32), jnp.int32, sharding=mesh_lib.rows(mesh))
        key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=mesh_lib.replicated(mesh))
        for way in ("masked", "lanes"):
            attention_lib.DECODE_ATTENTION = way
            sampler = Sampler(graphdef, max_new_tokens=256, eos_ids=(98,), pad_id=0, mesh=mesh,
                              param_shardings=shardings)
            with attention_lib.traced_for("tpu", kernels=True):
                text = sampler._jit(True, True).lower(state, prompts, prompts, key, SamplingParams(temperature=1.0),
                                                      8).compile().as_text()
            sizes, fused = [], False
            for line in text.splitlines():
                if not line.startswith(" "):  # a computation's header: a fusion's body copies nothing on its own
                    fused = "fused" in line.split("(")[0] or "fusion" in line.split("(")[0]
                m = re.search(r"= bf16\\[([0-9,]+)\\]", line)
                if not fused and " copy(" in line and m:
                    sizes.append(int(np.prod([int(d) for d in m.group(1).split(",")])))
            print(way, "layer", 128 * 2 * 288 * 64, "largest copy", max(sizes, default=0))
    """)
    lines = {line.split()[0]: [int(x) for x in line.split()[2::3]] for line in out.splitlines()
             if line.split()[:1] in (["masked"], ["lanes"])}
    (layer, masked), (_, lanes) = lines["masked"], lines["lanes"]
    assert masked >= layer, out  # the heads' layout: a layer copied a step
    assert lanes < layer, out
