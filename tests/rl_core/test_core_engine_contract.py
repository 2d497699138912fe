"""The engine contract (rl_core.rollout.backend) over every registered engine (rl_core.rollout.engines).

Each engine named in the entry-point group `rl_core.engines` is built the way a run builds it
(`make_backend`) and checked on what callers rely on: the protocol's members, versions stamped
on every row and token, its declared `Capabilities` holding (row limits, sessions, published
weights, counters), and greedy tokens equal to the static sampler's on the same weights. A new
engine that passes here works with the learner, the episodes and the planner's callers.
"""

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from rl_core import registry
from rl_core.config import ConfigError, RolloutConfig
from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Capabilities, EngineCounters, Requests, RolloutBackend
from rl_core.rollout.engines import STATIC, Engine, EngineBuild
from rl_core.rollout.factory import make_backend
from rl_core.rollout.paged_settings import EngineSettings, PagedSettings
from rl_core.rollout.memory import EngineMemory, MemoryQuery, argument_bytes, per_device
from rl_core.rollout.sampler import GREEDY
from rl_models import PAGED_TRANSFORMER, Transformer
from rl_models.hf import export_hf, load_hf_model, transformer_config_from_hf
from host import backend as jax_backend, need_sockets

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
T = 5
EOS = (302,)
PROMPTS = ([5, 17, 40], [9, 200, 31, 7, 3, 88])  # 3 and 6 tokens: a page border (4) inside the second
ENGINES = registry.engine_names()
# the vllm engine needs a real vLLM server: its cases run in the `vllm` tier (docs/vllm.md)
CASES = [pytest.param(n, marks=pytest.mark.vllm) if n == "vllm" else n for n in ENGINES]


@pytest.fixture(scope="module")
def model():
    return load_hf_model(HF / "qwen2")


@pytest.fixture(scope="module")
def servers():
    """Two engine servers of the same model (the `trainer serve` app on threads), for engines that
    generate on servers (`remote`); started only when such an engine is registered."""
    need_sockets()
    from trainer.serve import EngineOptions, serve_in_thread, served_folder

    options = EngineOptions(max_prompt_tokens=8, max_new_tokens=T, engine=PagedSettings(**PAGED), top_logprobs=0)
    served = [served_folder(HF / "qwen2", options) for _ in range(2)]
    running = [serve_in_thread(s) for s in served]
    yield tuple(r.url for r in running)
    for r, s in zip(running, served, strict=True):
        r.stop()
        s.loop.close()


@pytest.fixture(scope="module")
def wide_folder(tmp_path_factory):
    """The fixture's Qwen2 with heads of 32 dimensions (4 x 32 = 128 wide), random weights: vLLM's
    CPU attention has no kernel for the fixture's 16 (its smallest is 32)."""
    hf = json.loads((HF / "qwen2" / "config.json").read_text())
    hf |= {"hidden_size": 128, "intermediate_size": 256}
    out = tmp_path_factory.mktemp("qwen2-wide")
    export_hf(Transformer(transformer_config_from_hf(hf), rngs=nnx.Rngs(0)), out, model_type="qwen2")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(HF / "qwen2" / name, out / name)
    return out


@pytest.fixture(scope="module")
def vllm_server(wide_folder):
    """A vLLM server of the wide model (trainer.remote.vllm_server), for the `vllm` engine; skipped,
    saying why, where vLLM's environment ($VLLM_VENV) is missing or its server does not start."""
    from trainer.remote.vllm_server import Server, VLLMUnavailable

    try:
        with Server(wide_folder, kv_cache_gib=1) as running:
            yield (running.url,)
    except VLLMUnavailable as e:
        pytest.skip(f"no vLLM server: {e}")


def case_model(name, model, request):
    """The model an engine's case runs: the fixture's, or for vLLM the wide one its server loads."""
    return load_hf_model(request.getfixturevalue("wide_folder")) if name == "vllm" else model


PAGED = {"page_size": 4, "slots": 4, "prefill_chunk": 8, "steps_per_sync": 2}
"""The paged engine's small shapes, for every engine whose settings take them (its record's `settings`)."""


def rollout(engine: str, servers: tuple[str, ...] = ()) -> RolloutConfig:
    try:
        takes = {f.name for f in dataclasses.fields(registry.get_engine(engine).settings)}
    except registry.RegistryError:
        takes = set()  # RolloutConfig says it is unknown
    options = {k: v for k, v in PAGED.items() if k in takes} | ({"servers": servers} if servers else {})
    return RolloutConfig(engine=engine, max_prompt_tokens=8, max_new_tokens=T, temperature=0.0, options=options)


def make(name: str, model, request) -> RolloutBackend:
    urls = {"remote": "servers", "vllm": "vllm_server"}.get(name)
    urls = request.getfixturevalue(urls) if urls else ()
    return make_backend(rollout(name, urls), nnx.graphdef(model), eos_ids=EOS, pad_id=0, batch_size=4,
                        paging=PAGED_TRANSFORMER)


def build(name: str, model, request) -> RolloutBackend:
    _, state = nnx.split(model)
    backend = make(name, model, request)
    backend.update_weights(state, 3)
    return backend


def requests(**kw) -> Requests:
    tokens, mask = left_pad([list(p) for p in PROMPTS], pad_id=0, max_tokens=8)
    return Requests(tokens, mask, num_samples=2, **kw)


@pytest.fixture(scope="module")
def static_greedy(model, request):
    return build("static", model, request).generate(requests(), GREEDY, jax.random.key(0))


def test_the_workspaces_engines_are_registered_under_their_names():
    assert {"static", "paged", "remote", "vllm"} <= set(ENGINES)  # remote, vllm: the trainer's entry points
    for name in ENGINES:
        engine = registry.get_engine(name)
        assert isinstance(engine, Engine) and engine.name == name


@pytest.mark.parametrize("name", CASES)
def test_engine_meets_the_contract(name, model, static_greedy, request):
    model = case_model(name, model, request)
    if name == "vllm":
        static_greedy = build("static", model, request).generate(requests(), GREEDY, jax.random.key(0))
    backend = build(name, model, request)
    assert isinstance(backend, RolloutBackend)  # every protocol member, capabilities included
    caps = backend.capabilities
    assert isinstance(caps, Capabilities) and backend.version == 3
    offers = registry.get_engine(name).offers  # what its record declared before it was built: no less
    beyond = [f.name for f in dataclasses.fields(Capabilities) if getattr(caps, f.name) and not getattr(offers, f.name)]
    assert beyond == []
    before = backend.counters()
    assert isinstance(before, EngineCounters)

    out = backend.generate(requests(), GREEDY, jax.random.key(0))
    assert out.tokens.shape == (4, T) and out.lengths.shape == (4,)
    assert (out.version == 3).all() and (np.asarray(out.token_version) == 3).all()
    np.testing.assert_array_equal(out.mask, np.arange(T)[None, :] < out.lengths[:, None])
    # greedy: the static sampler's tokens on the same weights, sample 2 of a prompt = sample 1
    kept = np.asarray(out.mask, bool)
    np.testing.assert_array_equal(np.where(kept, out.tokens, -1), np.where(kept, static_greedy.tokens, -1))
    np.testing.assert_array_equal(out.lengths, static_greedy.lengths)

    counted = backend.counters()
    if caps.counts_prefill:  # each prompt prefilled once for its two samples, all but its last token
        # (the first decode step reads that one): 2 + 5
        assert counted.prefill_tokens - before.prefill_tokens == 7
    else:
        assert counted == EngineCounters()

    limited = backend.generate(requests(max_new_tokens=np.array([2, 1])), GREEDY, jax.random.key(0))
    if caps.row_limits:  # each row stops at its prompt's own limit: its first 2 (1) greedy tokens
        np.testing.assert_array_equal(limited.lengths, np.minimum(static_greedy.lengths, [2, 2, 1, 1]))
    else:
        np.testing.assert_array_equal(limited.lengths, static_greedy.lengths)

    handles = backend.new_sessions(3)
    if caps.retains:
        assert len(set(handles.tolist())) == 3 and (handles >= 0).all()
    else:
        assert handles.tolist() == [-1, -1, -1]
    backend.release(handles)
    backend.release()

    assert backend.publish(nnx.split(model)[1], 4) is caps.takes_published
    assert backend.version == 3  # published weights reach a running rollout only, never the next call


@pytest.mark.parametrize("name", CASES)
def test_generate_before_weights_says_so(name, model, request):
    backend = make(name, case_model(name, model, request), request)
    assert backend.version == -1
    with pytest.raises(RuntimeError, match="before update_weights"):
        backend.generate(requests(), GREEDY, jax.random.key(0))


def test_a_package_adds_an_engine_by_registering_it(monkeypatch, model):
    """What an entry point in `rl_core.engines` gives: `rollout.engine` takes the new name and
    `make_backend` builds it, with no change to rl_core (a fresh registry stands in for discovery)."""
    built = []

    def mine(b: EngineBuild):
        built.append(b.rollout.engine)
        return STATIC.build(b)

    fresh = registry.Registry(engine_group="rl_core.engines.none")
    monkeypatch.setattr(registry, "registry", fresh)
    with pytest.raises(ConfigError, match="unknown engine 'mine'"):
        rollout("mine")
    fresh.register(registry.ENGINE, "mine", Engine(name="mine", build=mine, memory=STATIC.memory))
    backend = make_backend(rollout("mine"), nnx.graphdef(model), eos_ids=EOS, pad_id=0)
    assert built == ["mine"] and isinstance(backend, RolloutBackend)


def compiled_bytes(jitted, *args) -> tuple[int, int, int]:
    stats = jitted.lower(*args).compile().memory_analysis()
    return stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.temp_size_in_bytes


@pytest.mark.parametrize("name", ENGINES)
def test_engine_says_what_it_holds_for_the_planner(name, model):
    """`Engine.memory`: what `trainer plan` counts for the engine, asked with the model's shapes and
    the run's rollout settings (one device here); its table lines name entries it gives."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: model))
    weights = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), nnx.to_pure_dict(state))
    c = model.config
    token_kv = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4  # float32
    urls = ("http://127.0.0.1:9",) if name == "remote" else ()
    q = MemoryQuery(rollout=rollout(name, urls), graphdef=graphdef, weights=weights, variables=state, prompts=2,
                    samples=2, batch_size=4, prompt_tokens=8, new_tokens=T, mean_new_tokens=T,
                    num_kv_heads=c.num_kv_heads, kv_token_bytes=token_kv, compute_bytes=4,
                    dense_cache_bytes=4 * (8 + T) * token_kv, compiled=compiled_bytes)
    held = registry.get_engine(name).memory(q)
    assert isinstance(held, EngineMemory)
    assert min(held.held_bytes, held.cache_bytes, held.weight_bytes) >= 0
    for label, ck, ak in held.rows:
        assert label and (ck is None or ck in held.compiled) and (ak is None or ak in {*held.analytic, "kv_cache"})
    if name == "static":  # its program holds the cache of 4 rows at full length; it samples the trained weights
        assert held.cache_bytes == q.dense_cache_bytes and held.weight_bytes == 0
        if jax_backend() == "cpu":  # read from XLA:CPU's memory analysis; XLA:TPU's counts 7,680 temporary
            assert held.held_bytes >= held.cache_bytes  # bytes for this tiny program (v5e, 2026-12-06)
        # the weights and the key (two uint32) as laid out: on XLA:CPU 8 bytes more than the weights
        key = jax.eval_shape(lambda: jax.random.key(0))
        assert held.compiled_weight_bytes == argument_bytes((weights, key))
        assert jax_backend() != "cpu" or held.compiled_weight_bytes == per_device(weights) + 8
    elif name == "paged":  # its page pool and a float32 weight copy
        pool = EngineSettings.from_rollout(q.rollout, batch_size=4).pool_pages * 4 * token_kv
        assert held.cache_bytes == pool and held.weight_bytes == per_device(weights)
        assert held.held_bytes == pool + per_device(weights)
    elif name == "remote":  # on its servers
        assert held.held_bytes == 0
