"""model.attention: which kernel each platform gets, clear errors, and the fused kernels' handling
of masks checked against the XLA path (Splash itself on a TPU, in the Pallas interpreter
elsewhere; cuDNN's even-length padding through the XLA path of the same call)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.policy.logprobs import sequence_inputs
from rl_core.train.packing import pack
from rl_models import Transformer, TransformerConfig
from rl_models import attention
from rl_models import block as block_lib
from rl_models.attention import attend

from host import about_the_cpu, backend
from tolerances import close

V = 37
BF16, F32 = jnp.bfloat16, jnp.float32


@pytest.mark.parametrize(
    ("platform", "dtype", "head_dim", "expected"),
    [
        ("gpu", BF16, 128, "cudnn"),
        ("gpu", F32, 128, "xla"),  # cuDNN's flash attention takes bfloat16 only
        ("gpu", BF16, 256, "xla"),  # head sizes up to 128 (256 only on Hopper: not assumed)
        ("gpu", BF16, 12, "xla"),  # multiples of 8
        ("tpu", BF16, 64, "splash"),
        ("tpu", F32, 128, "splash"),
        ("cpu", BF16, 128, "xla"),
    ],
)
def test_auto_picks_by_platform(platform, dtype, head_dim, expected):
    assert attention.resolve("auto", dtype=dtype, head_dim=head_dim, platform=platform) == expected


@pytest.mark.parametrize(("length", "expected"), [(None, "splash"), (127, "xla"), (128, "splash"), (15, "xla")])
def test_auto_on_tpu_runs_short_sequences_as_xla(length, expected):
    """Under one Splash block (128 queries) `auto` is xla on a TPU; an explicit splash stands."""
    assert attention.resolve("auto", dtype=BF16, head_dim=64, platform="tpu", length=length) == expected
    assert attention.resolve("splash", dtype=BF16, head_dim=64, platform="tpu", length=length) == "splash"


@about_the_cpu("a program traced on this host is traced for the CPU unless told otherwise")
def test_an_explicit_choice_stands_and_a_kernel_the_platform_lacks_is_a_clear_error():
    assert attention.resolve("xla", dtype=BF16, head_dim=128, platform="tpu") == "xla"
    assert attention.resolve("splash", dtype=F32, head_dim=16, platform="tpu") == "splash"
    with pytest.raises(ValueError, match="attention='splash': JAX's Splash kernel runs on TPU, and this program is "
                                         "traced for 'cpu'; use 'auto'"):
        attention.resolve("splash", dtype=BF16, head_dim=128)  # this CPU
    with pytest.raises(ValueError, match="attention='cudnn': cuDNN's flash attention runs on NVIDIA GPUs, and this "
                                         "program is traced for 'tpu'"):
        attention.resolve("cudnn", dtype=BF16, head_dim=128, platform="tpu")
    with attention.traced_for("tpu"):  # a plan for a TPU traces on this CPU as for the TPU
        assert attention.resolve("auto", dtype=BF16, head_dim=128) == "splash"
    assert attention.target_platform() == "cpu"


@about_the_cpu("Splash on a CPU run: on a TPU it runs")
def test_splash_on_a_cpu_run_fails_at_the_first_forward_pass_naming_the_fix():
    model = Transformer(TransformerConfig.tiny(V, attention="splash"), rngs=nnx.Rngs(0))
    tokens = jnp.ones((1, 4), jnp.int32)
    positions, mask = sequence_inputs(jnp.ones((1, 2)), 2)
    with pytest.raises(ValueError, match="use 'auto' \\(picks by platform\\) or 'xla'"):
        model(tokens, positions, mask)


@about_the_cpu("auto is the xla program on a CPU only (Splash on a TPU)")
def test_the_default_is_auto_and_on_cpu_it_is_the_xla_program():
    """The same lowered forward and backward as attention=xla, so CPU numbers do not move."""
    assert TransformerConfig.tiny(V).attention == "auto"
    positions, mask = sequence_inputs(jnp.array([[0, 1, 1]], jnp.float32), 3)
    tokens = jnp.array([[0, 5, 6, 7, 8, 9]], jnp.int32)

    def lowered(kind):
        graphdef, params = nnx.split(Transformer(TransformerConfig.tiny(V, attention=kind), rngs=nnx.Rngs(0)))

        def loss(p):
            m = nnx.merge(graphdef, p)
            return jnp.sum(m.logits(m(tokens, positions, mask)[0]))

        return jax.jit(jax.grad(loss)).lower(params).as_text()

    assert lowered("auto") == lowered("xla")


def qkv(b, l, s, h=4, k=2, dh=16, dtype=F32):
    keys = jax.random.split(jax.random.key(0), 3)
    return (jax.random.normal(keys[0], (b, l, h, dh), dtype), jax.random.normal(keys[1], (b, s, k, dh), dtype),
            jax.random.normal(keys[2], (b, s, k, dh), dtype))


def interpret() -> bool:
    """Whether Splash runs in the Pallas interpreter: everywhere but on a TPU, where the kernel runs."""
    return backend() != "tpu"


def xla_attention(q, k, v, mask):
    return attend(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask)


def padded_layout():
    """rl_core.policy.logprobs' layout: 7 prompt slots (row 1 has 3 pads) and 9 completion slots."""
    prompt_mask = jnp.array([[1] * 7, [0, 0, 0, 1, 1, 1, 1]], jnp.float32)
    return sequence_inputs(prompt_mask, 9)[1]


def packed_layout():
    """rl_core.train.packing's layout: four sequences of 5, 9, 7 and 3 tokens in two 16-slot rows (causal
    within each segment; the row ends are padding that sees nothing)."""
    prompt_mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]], np.float32)
    completion_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], np.float32)
    packed = pack(np.ones((4, 4), np.int32), prompt_mask, np.ones((4, 5), np.int32), completion_mask, width=16, rows=2)
    mask = packed.attention_mask()
    assert mask.shape == (2, 16, 16) and int((packed.segments > 0).sum()) == 24
    return mask


@pytest.mark.parametrize("layout", [padded_layout, packed_layout], ids=["padded", "packed"])
def test_splash_equals_xla_on_real_tokens_with_gradients(layout):
    """16 slots, padded to one 128-slot block. Outputs and the gradients of q, k, v agree to 1e-5
    on every real query (a padding query's output is never read, so it is left out of the loss and
    the comparison)."""
    mask = layout()
    real = mask.any(axis=-1)[..., None]  # [B, L, 1]: queries with a key to see
    q, k, v = qkv(2, 16, 16)
    weights = jax.random.normal(jax.random.key(1), (2, 16, 64)) * real

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * weights)

    splash = lambda q, k, v: attention.splash(q, k, v, mask, interpret=interpret())  # noqa: E731
    xla = lambda q, k, v: xla_attention(q, k, v, mask)  # noqa: E731
    np.testing.assert_allclose(splash(q, k, v) * real, xla(q, k, v) * real, **close(rtol=1e-5, atol=1e-5))
    got = jax.grad(loss(splash), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(xla), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, **close(rtol=1e-5, atol=1e-5, of="kernel gradients"))


def kernel_dot_precisions(jaxpr) -> list:
    """The precision of every matrix product inside the Pallas kernels of `jaxpr`, at any depth."""
    found = []

    def walk(jaxpr, in_kernel):
        for eqn in jaxpr.eqns:
            if in_kernel and eqn.primitive.name == "dot_general":
                found.append(eqn.params["precision"])
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner, in_kernel or eqn.primitive.name == "pallas_call")

    walk(jaxpr.jaxpr, False)
    return found


def test_splash_on_bfloat16_runs_forward_and_backward_at_the_default_precision_under_highest():
    """Mosaic compiles no bfloat16 product at a float32 contract precision ("Bad lhs type" on a v5e
    under the suite's `highest`): Splash's kernels, backward ones included, trace theirs at the
    default whatever the caller's, while the float32 kernels keep the caller's."""
    mask = padded_layout()

    def grad_jaxpr(dtype):
        q, k, v = qkv(2, 16, 16, dtype=dtype)
        loss = lambda q, k, v: jnp.sum(attention.splash(q, k, v, mask, interpret=True).astype(F32))  # noqa: E731
        with jax.default_matmul_precision("highest"):
            return jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

    highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
    bf16 = kernel_dot_precisions(grad_jaxpr(jnp.bfloat16))
    assert len(bf16) >= 6 and highest not in bf16  # forward, dq and dkv kernels: 2 products each at least
    f32 = kernel_dot_precisions(grad_jaxpr(F32))
    assert len(f32) == len(bf16) and set(f32) == {highest}


def test_splash_on_bfloat16_in_a_remat_layer_traces_again_in_a_second_program():
    """`trainer bench` plans the update (one trace) then the learner jits its own (another): JAX reuses
    its trace of a remat'd layer, so a bfloat16 Splash whose backward closed over the kernel's mask
    arrays of the first trace leaked them into the second (UnexpectedTracerError on the v5e, 1.5B LoRA
    bench). Both programs run and give the same gradient, equal to the XLA path's within bfloat16."""
    mask = padded_layout()
    real = mask.any(axis=-1)[..., None]
    q, k, v = qkv(2, 16, 16, dtype=jnp.bfloat16)
    layer = jax.checkpoint(lambda q, k, v: attention.splash(q, k, v, mask, interpret=interpret()))
    loss = lambda q, k, v: jnp.sum((layer(q, k, v) * real).astype(F32))  # noqa: E731
    jax.jit(jax.grad(loss)).lower(q, k, v)  # the plan's trace
    first = jax.jit(jax.grad(loss))(q, k, v)
    second = jax.jit(jax.grad(loss))(q, k, v)
    np.testing.assert_array_equal(first, second)
    xla = lambda q, k, v: jnp.sum((xla_attention(q, k, v, mask) * real).astype(F32))  # noqa: E731
    np.testing.assert_allclose(first.astype(F32), jax.grad(xla)(q, k, v).astype(F32), rtol=0.05, atol=0.05)


def test_splash_segments_of_a_mask():
    """The packed layout's rows: 9 + 7 tokens, and 5 + 3 tokens then 8 slots of padding; a query's
    segment is the first slot it may see, padding's -1, and so are the slots past the queries."""
    seg_q, seg_kv = attention.segment_ids(packed_layout(), 0, 20)
    np.testing.assert_array_equal(seg_q, [[0] * 9 + [9] * 7, [0] * 5 + [5] * 3 + [-1] * 8])
    np.testing.assert_array_equal(seg_kv, [[0] * 9 + [9] * 7 + [-1] * 4, [0] * 5 + [5] * 3 + [-1] * 12])


@pytest.mark.parametrize("offset", [0, 3])
def test_splash_prefill_into_a_longer_cache_equals_xla(offset):
    """Queries at slots offset..offset+5 of a 12-slot cache (the sampler's prefill is offset 0):
    causal over the real slots; the slots past the queries are empty (never seen)."""
    l, s = 6, 12
    valid = jnp.array([[True] * s, [False, False] + [True] * (s - 2)])
    valid = valid & (jnp.arange(s) < offset + l)  # the cache is filled up to the last query
    causal = jnp.arange(s)[None, :] <= offset + jnp.arange(l)[:, None]
    mask = causal[None] & valid[:, None, :]
    q, k, v = qkv(2, l, s)
    real = jax.lax.dynamic_slice_in_dim(valid, offset, l, axis=1)[..., None]
    got = attention.splash(q, k, v, mask, offset=offset, interpret=interpret())
    np.testing.assert_allclose(got * real, xla_attention(q, k, v, mask) * real, **close(rtol=1e-5, atol=1e-5))


def test_cudnn_gets_even_lengths_and_the_padding_changes_no_row():
    """cuDNN trains with a mask only on even lengths: 9 queries and 9 keys get a tenth each. The
    padded call, run by jax.nn.dot_product_attention's XLA path here, equals the unpadded one on
    every query that has a key to see."""
    _, mask = sequence_inputs(jnp.array([[0, 1, 1, 1]], jnp.float32), 5)
    q, k, v = qkv(1, 9, 9)
    padded = attention._even_lengths(q, k, v, mask)
    assert [x.shape[1] for x in padded] == [10, 10, 10, 10] and padded[3].shape == (1, 10, 10)
    assert bool(padded[3][0, 9, 9]) and not padded[3][0, :9, 9].any()  # the new query sees the new key alone

    def sdpa(q, k, v, mask):
        return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation="xla")

    real = mask.any(axis=-1)[..., None, None]  # a query with no key to see gets a made-up row either way
    np.testing.assert_allclose(sdpa(*padded)[:, :9] * real, sdpa(q, k, v, mask) * real, **close(rtol=1e-6, atol=1e-6))


@about_the_cpu("a program traced on this host for another platform: the stand-in runs where the kernel cannot "
               "(on a TPU Splash itself compiles, and XLA:TPU reports 0 temporary bytes for this tiny model)")
@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_a_plan_for_an_accelerator_compiles_the_fused_kernels_stand_in_with_their_memory(platform):
    """On this CPU, traced for a GPU (cuDNN) or a TPU (Splash): the kernel is a stand-in that
    keeps what a flash kernel keeps (inputs, output, log-sum-exp), so the backward pass of a
    384-token sequence holds no [H, L, L] float32 probabilities, unlike attention=xla."""
    config = TransformerConfig.tiny(V, dtype="bfloat16", scan_layers=True)
    positions, mask = sequence_inputs(jnp.ones((2, 128)), 256)
    tokens = jnp.ones((2, 384), jnp.int32)

    def temp_bytes(attention_setting):
        model = Transformer(dataclasses_replace(config, attention=attention_setting), rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model)

        def loss(p):
            m = nnx.merge(graphdef, p)
            return jnp.sum(m.logits(m(tokens, positions, mask)[0]).astype(F32))

        compiled = jax.jit(jax.grad(loss)).lower(params).compile()
        assert "__cudnn" not in compiled.as_text() and "tpu_custom_call" not in compiled.as_text()
        return compiled.memory_analysis().temp_size_in_bytes

    with attention.traced_for(platform):
        fused = temp_bytes("auto")
    probabilities = 2 * 4 * 384 * 384 * 4  # rows x heads x L x L float32: one layer's
    assert fused + probabilities < temp_bytes("xla")


def dataclasses_replace(config, **changes):
    import dataclasses

    return dataclasses.replace(config, **changes)


SPLASH_ON_A_MESH = """
import jax, jax.numpy as jnp, numpy as np
from rl_core.runtime import mesh as mesh_lib
from rl_core.policy.logprobs import sequence_inputs
from rl_models import attention
from rl_models.attention import attend

mesh = mesh_lib.make_mesh(fsdp=2, tensor=2)
with attention.traced_for("tpu"):  # Splash only where it can run: per device, under the layout
    assert attention.traced_kernel("auto", dtype=jnp.bfloat16, head_dim=128) == "xla"
    with mesh_lib.activation_layout(mesh):
        assert attention.traced_kernel("auto", dtype=jnp.bfloat16, head_dim=128) == "splash"
_, mask = sequence_inputs(jnp.array([[1] * 7, [0, 0, 1, 1, 1, 1, 1]] * 2, jnp.float32), 9)
keys = jax.random.split(jax.random.key(0), 3)
q = jax.random.normal(keys[0], (4, 16, 4, 16))
k, v = (jax.random.normal(key, (4, 16, 2, 16)) for key in keys[1:])
rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
splash = jax.jit(mesh_lib.with_activation_layout(mesh, lambda q, k, v, m: attention.splash(q, k, v, m, interpret=True)),
                 in_shardings=rows, out_shardings=rows)
text = splash.lower(q, k, v, mask).as_text()
assert "shard_map" in text or "sdy.manual_computation" in text, "the kernel runs per device"
real = mask.any(axis=-1)[..., None]
want = attend(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask)
np.testing.assert_allclose(splash(q, k, v, mask) * real, want * real, atol=1e-5, rtol=1e-5)
print("ok")
"""


@pytest.mark.multidevice
def test_splash_runs_per_device_under_the_activation_layout():
    """On 4 simulated devices (fsdp=2 x tensor=2), traced as the learner traces (rows over fsdp,
    the 2 KV heads over tensor): one shard_map around the kernel, and the same numbers as xla.
    Without the layout (the static sampler's prefill) a program on several devices gets xla:
    XLA cannot split the kernel's call."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SPLASH_ON_A_MESH], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@pytest.mark.parametrize("live", [1, 5, 9, 16, 23])
def test_a_decode_step_over_the_live_blocks_equals_attend_over_the_whole_cache(live):
    """`attend_live` (an accelerator's decode step over the static engine's stacked cache, its values'
    product a float32 sum that XLA:TPU reads in place) reads only the
    blocks of slots up to `live` (online softmax; the last block ends at the last slot, overlapping the one
    before, whose slots it must not count twice), and gives `attend`'s output over the whole masked cache:
    23 slots in blocks of 128 slots would be one block, so the test narrows them to 8."""
    rng = np.random.default_rng(1)
    b, h, kv, s, dh, layers = 3, 6, 2, 23, 8, 3
    q = jnp.asarray(rng.normal(size=(b, 1, h, dh)), F32)
    stack = tuple(jnp.asarray(rng.normal(size=(layers, b, kv, s, dh)), F32) for _ in "kv")
    padding = np.array([0, min(2, live - 1), 0])[:, None]  # row 1's first slots are prompt padding (it sees its own)
    mask = jnp.asarray((np.arange(s)[None] < live) & (np.arange(s)[None] >= padding))[:, None]
    want = attend(q, stack[0][1], stack[1][1], mask, 0.3, softcap=5.0)
    old = block_lib.LIVE_BLOCKS
    try:
        block_lib.LIVE_BLOCKS, block_lib.BLOCK_SLOTS = 3, 8  # blocks of 8 slots: 0-7, 8-15, 15-22
        run = jax.jit(block_lib.attend_live, static_argnums=(5, 6))
        got = run(q, stack, jnp.int32(1), mask, jnp.int32(live), 0.3, 5.0)
    finally:
        block_lib.LIVE_BLOCKS, block_lib.BLOCK_SLOTS = old, 128
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), **close(rtol=1e-5, atol=1e-6))
