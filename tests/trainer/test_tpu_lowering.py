"""Every TPU program lowers for TPU on this CPU host: the paged engine's step (prefill chunk and
decode, JAX's Pallas ragged paged-attention kernel over the combined lane-packed pool) and the learner's update
(Splash attention forward and backward), for head dims 64, 128 and 256. Mosaic refuses a block
shape at lowering time, so a kernel that could not run on a chip fails here, in CI, without one."""

import jax
import pytest
from flax import nnx
from rl_core.policy import frozen as frozen_lib
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.ragged import RaggedKV
from rl_core.rollout.sampler import SamplingParams
from rl_core.runtime import mesh as mesh_lib
from rl_models import PAGED_TRANSFORMER, Transformer, TransformerConfig, model_class
from rl_models.attention import traced_for
from trainer.plan.programs import policy_programs
from trainer.settings import build_settings

# (query heads, kv heads, head dim): Qwen2.5-0.5B's grouping at 64 (7 query heads a kv head, two kv
# heads packed in one lane group), an odd kv count at 64 (SmolLM2's 3: a zero head pads the pair),
# Llama's 128, Gemma's 256
SHAPES = [(14, 2, 64), (9, 3, 64), (8, 2, 128), (4, 2, 256)]
MORE_SHAPES = [(8, 8, 80), (12, 4, 96), (6, 3, 128)]
"""Phi's 80 and 96 (zero-padded to 128 lanes) and 3 kv heads of 128 (lane groups padded to 4)."""


def _config(heads: int, kv_heads: int, head_dim: int, **overrides) -> TransformerConfig:
    return TransformerConfig.tiny(96, hidden_size=128, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                                  dtype="bfloat16", **overrides)


SOFTCAPS = dict(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
"""Gemma 2's soft-caps: Splash's and the TPU paged kernel's `attn_logits_soft_cap`, and the capped head."""


def _custom_calls(text: str) -> int:
    return text.count("tpu_custom_call")


def _paged_step_text(heads: int, kv_heads: int, head_dim: int, mesh=None) -> str:
    with traced_for("tpu", kernels=True):
        model = Transformer(_config(heads, kv_heads, head_dim), rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(model)
        settings = EngineSettings(slots=8, page_size=16, max_prompt_tokens=24, max_new_tokens=40, prefill_chunk=16)
        engine = PagedBackend(graphdef, settings, paging=PAGED_TRANSFORMER, eos_ids=(1,), pad_id=0, platform="tpu",
                              mesh=mesh)
        assert isinstance(engine.kv, RaggedKV)
        engine.update_weights(state, 1)
        return engine.lower_step(SamplingParams(temperature=1.0), jax.random.key(0), platforms=("tpu",)).as_text()


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), SHAPES + MORE_SHAPES, ids=lambda x: str(x))
def test_paged_engine_step_lowers_for_tpu(heads, kv_heads, head_dim):
    # the Pallas kernel is in the program (one call a layer in the prefill and in the decode)
    assert _custom_calls(_paged_step_text(heads, kv_heads, head_dim)) >= 2


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), SHAPES[1:3], ids=lambda x: str(x))
def test_paged_engine_step_lowers_for_tpu_on_the_trainers_mesh(heads, kv_heads, head_dim):
    """As `trainer train` builds it: laid out on a mesh, whose pool sharding names one axis per pool
    dimension (the combined 4-D pool first stopped here on the chip: 5 names for 4 axes)."""
    assert _custom_calls(_paged_step_text(heads, kv_heads, head_dim, mesh=mesh_lib.make_mesh())) >= 2


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), SHAPES[::2] + SHAPES[3:], ids=lambda x: str(x))
def test_update_lowers_for_tpu_with_splash(heads, kv_heads, head_dim):
    settings = build_settings(algo="grpo", overrides=[
        "training.prompts_per_step=2", "algorithm.group_size=2", "rollout.max_prompt_tokens=31",
        "rollout.max_new_tokens=129"])  # 128 completion queries: `auto` runs fewer as xla
    mesh = mesh_lib.training_mesh(settings.training)
    with traced_for("tpu", kernels=True):
        abstract = nnx.eval_shape(lambda: Transformer(_config(heads, kv_heads, head_dim), rngs=nnx.Rngs(0)))
        graphdef, params, frozen, _ = frozen_lib.split_policy(abstract)
        programs = policy_programs(settings, mesh, graphdef, params, frozen)
        batch = programs.mini_batch(programs.layout.num_micro_batches)
        text = programs.update.trace(programs.state, programs.frozen, batch).lower(
            lowering_platforms=("tpu",)).as_text()
    assert _custom_calls(text) >= 2  # Splash's forward and backward kernels


def _engine_and_update_texts(config: TransformerConfig) -> tuple[str, str]:
    """The paged engine's step and the GRPO update of a model of `config`, lowered for TPU on this host."""
    with traced_for("tpu", kernels=True):
        model = model_class(config)(config, rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(model)
        settings = EngineSettings(slots=8, page_size=16, max_prompt_tokens=24, max_new_tokens=40, prefill_chunk=16)
        engine = PagedBackend(graphdef, settings, paging=PAGED_TRANSFORMER, eos_ids=(1,), pad_id=0, platform="tpu")
        engine.update_weights(state, 1)
        step = engine.lower_step(SamplingParams(temperature=1.0), jax.random.key(0), platforms=("tpu",)).as_text()
    settings = build_settings(algo="grpo", overrides=[
        "training.prompts_per_step=2", "algorithm.group_size=2", "rollout.max_prompt_tokens=31",
        "rollout.max_new_tokens=129"])  # 128 completion queries: `auto` runs fewer as xla
    mesh = mesh_lib.training_mesh(settings.training)
    with traced_for("tpu", kernels=True):
        abstract = nnx.eval_shape(lambda: model_class(config)(config, rngs=nnx.Rngs(0)))
        graphdef, params, frozen, _ = frozen_lib.split_policy(abstract)
        programs = policy_programs(settings, mesh, graphdef, params, frozen)
        batch = programs.mini_batch(programs.layout.num_micro_batches)
        update = programs.update.trace(programs.state, programs.frozen, batch).lower(
            lowering_platforms=("tpu",)).as_text()
    return step, update


def test_soft_capped_attention_lowers_for_tpu_in_the_engine_and_the_update():
    """With Gemma 2's caps (at Gemma's head dim 256) both programs still call the kernels."""
    step, update = _engine_and_update_texts(_config(4, 2, 256, **SOFTCAPS))
    assert _custom_calls(step) >= 2
    assert _custom_calls(update) >= 2


def _gemma4_config() -> TransformerConfig:
    """Gemma 4's shapes at small width: windowed layers of 2 KV heads of 256, global ones of 1 KV
    head of 512 with keys as values and proportional rope, the last two layers sharing keys and
    values, per-layer inputs (rl_models.gemma4)."""
    from rl_models.rope_types import ProportionalRope

    return _config(4, 2, 256, num_layers=6, layer_types=("sliding_attention", "sliding_attention", "full_attention") * 2,
                   sliding_window=8, global_head_dim=512, global_kv_heads=1, keys_as_values=True, value_norm=True,
                   kv_shared_layers=2, per_layer_input_size=16, layer_scalars=True, qk_norm=True, query_scale=1.0,
                   sandwich_norms=True, embed_scale=True, hidden_act="gelu_tanh", rope_local_theta=1e4,
                   rope_scaling=ProportionalRope(partial_rotary_factor=0.25), final_logit_softcapping=30.0)


def test_gemma4_layers_lower_for_tpu_in_the_engine_and_the_update():
    """The paged engine's pool at the global layers' 1 KV head of 512 (the Pallas kernel) beside the
    windowed layers' rings, and the update with Splash on the global layers (head size 512)."""
    step, update = _engine_and_update_texts(_gemma4_config())
    assert _custom_calls(step) >= 2
    assert _custom_calls(update) >= 2  # Splash's forward and backward kernels on the global layers
