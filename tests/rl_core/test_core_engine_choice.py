"""rollout.engine = "auto": the paged engine from 512 new tokens, the static sampler below;
explicit choices stand (rl_core.rollout.factory.resolve_engine)."""

import dataclasses

import pytest
from flax import nnx

from rl_core import registry
from rl_core.config import RolloutConfig
from rl_core.rollout.engines import PAGED, STATIC
from rl_core.rollout.factory import PAGED_FROM_NEW_TOKENS, explain_engine, make_backend, resolve_engine
from rl_core.rollout.paged import PagedBackend
from rl_core.rollout.static import StaticBackend
from rl_models import PAGED_TRANSFORMER, CharTokenizer, Transformer, TransformerConfig


def test_auto_is_the_default():
    assert RolloutConfig().engine == "auto"


@pytest.mark.parametrize(("new_tokens", "engine"), [(16, "static"), (256, "static"), (511, "static"), (512, "paged"), (4096, "paged")])
def test_auto_picks_by_new_tokens(new_tokens, engine):
    # where benchmarks/rollout_engines.py has paged win on the small model and on SmolLM2-135M
    assert PAGED_FROM_NEW_TOKENS == 512
    assert resolve_engine(RolloutConfig(max_new_tokens=new_tokens)) == engine


@pytest.mark.parametrize("new_tokens", [16, 511, 512, 1024])
@pytest.mark.parametrize("engine", ["static", "paged"])
def test_explicit_choices_stand(engine, new_tokens):
    rollout = RolloutConfig(max_new_tokens=new_tokens, engine=engine)
    assert resolve_engine(rollout) == resolve_engine(rollout, pageable=False) == engine


def test_auto_without_a_paged_adapter_is_static():
    assert resolve_engine(RolloutConfig(max_new_tokens=512), pageable=False) == "static"


def test_the_choice_explained():
    assert explain_engine(RolloutConfig(max_new_tokens=512)) == "paged (auto: 512 new tokens >= 512)"
    assert explain_engine(RolloutConfig(max_new_tokens=256)) == "static (auto: 256 new tokens < 512)"
    assert explain_engine(RolloutConfig(max_new_tokens=512, engine="static")) == "static (rollout.engine=static)"
    assert explain_engine(RolloutConfig(max_new_tokens=512), pageable=False) == (
        "static (auto: the policy has no paged adapter)")


def test_auto_reads_the_records_thresholds_not_names(monkeypatch):
    """A package's engine that declares `auto_from_new_tokens` joins the choice with no change to rl_core:
    the highest threshold at or below the run's new tokens wins; one that needs a paged adapter is
    passed over for a policy without one."""
    fresh = registry.Registry(engine_group="rl_core.engines.none")
    monkeypatch.setattr(registry, "registry", fresh)
    long = dataclasses.replace(PAGED, name="long", auto_from_new_tokens=2048)
    for record in (STATIC, PAGED, long):
        fresh.register(registry.ENGINE, record.name, record)
    picks = {n: resolve_engine(RolloutConfig(max_new_tokens=n)) for n in (16, 512, 2047, 2048, 4096)}
    assert picks == {16: "static", 512: "paged", 2047: "paged", 2048: "long", 4096: "long"}
    assert explain_engine(RolloutConfig(max_new_tokens=4096)) == "long (auto: 4096 new tokens >= 2048)"
    assert explain_engine(RolloutConfig(max_new_tokens=16)) == "static (auto: 16 new tokens < 512)"
    assert resolve_engine(RolloutConfig(max_new_tokens=4096), pageable=False) == "static"


def test_make_backend_builds_the_resolved_engine():
    tokenizer = CharTokenizer()
    graphdef = nnx.graphdef(Transformer(TransformerConfig.tiny(tokenizer.vocab_size), rngs=nnx.Rngs(0)))
    ids = dict(eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id)

    def backend(paging=PAGED_TRANSFORMER, **rollout):
        return make_backend(RolloutConfig(max_prompt_tokens=8, **rollout), graphdef, paging=paging, **ids)

    assert isinstance(backend(max_new_tokens=511), StaticBackend)
    assert isinstance(backend(max_new_tokens=512), PagedBackend)
    assert isinstance(backend(max_new_tokens=512, paging=None), StaticBackend)  # auto falls back
    assert isinstance(backend(max_new_tokens=512, engine="static"), StaticBackend)
    assert isinstance(backend(max_new_tokens=16, engine="paged"), PagedBackend)
    with pytest.raises(TypeError, match="needs the policy's paged adapter"):
        backend(max_new_tokens=16, engine="paged", paging=None)  # an explicit choice is not overruled
