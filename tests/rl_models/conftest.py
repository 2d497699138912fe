"""Shared helpers for the rl_models tests: fixture folders and a plain greedy
decoder over the model's KV cache (the trainer's sampler lives in rl_core)."""

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

HF_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
HF_NAMES = ("llama3", "qwen2", "qwen3", "mistral", "qwen3_yarn", "smollm3", "gemma3_text", "gemma3", "qwen3_moe",
            "olmo2", "olmo3", "phi3", "llama_dynamic", "gemma3_text_softcap", "gemma2", "gemma4_text", "gemma4_text_wide")



def hf_reference(name: str) -> tuple[dict[str, np.ndarray], dict]:
    arrays = load_file(str(HF_FIXTURES / "reference" / f"{name}.safetensors"))
    meta = json.loads((HF_FIXTURES / "reference" / f"{name}.json").read_text())
    return arrays, meta


@pytest.fixture(params=HF_NAMES)
def hf_name(request) -> str:
    return request.param


@pytest.fixture
def hf_copy(tmp_path):
    """A function copying fixture folder `name` into tmp_path (to damage it)."""

    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(HF_FIXTURES / name, dest)
        return dest

    return copy


def greedy_generate(model, prompt_ids, prompt_mask, max_new_tokens, eos_ids, pad_id):
    """Greedy decoding of left-padded prompts [B, P] with the model's cache:
    one prefill, then one jitted step per token; rows that produced an EOS id
    emit `pad_id` afterwards. Returns the new tokens [B, max_new_tokens]."""
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    b, p = prompt_ids.shape
    s = p + max_new_tokens
    valid = jnp.asarray(prompt_mask, bool)
    positions = jnp.cumsum(valid, axis=1) - 1
    slot_valid = jnp.zeros((b, s), bool).at[:, :p].set(valid)
    causal = jnp.arange(s)[None, :] <= jnp.arange(p)[:, None]
    graphdef, params = nnx.split(model)

    @jax.jit
    def step(params, tokens, positions, mask, cache, index):
        m = nnx.merge(graphdef, params)
        hidden, cache = m(tokens, positions, mask, cache, index)
        return jnp.argmax(m.logits(hidden[:, -1]), axis=-1).astype(jnp.int32), cache

    token, cache = step(params, prompt_ids, positions, causal[None] & slot_valid[:, None, :],
                        model.init_cache(b, s), 0)
    next_pos = positions[:, -1] + 1
    done = jnp.zeros((b,), bool)
    eos = jnp.asarray(eos_ids, jnp.int32)
    out = []
    for t in range(max_new_tokens):
        token = jnp.where(done, pad_id, token)
        out.append(token)
        done = done | jnp.isin(token, eos)
        if t == max_new_tokens - 1:
            break
        slot = p + t
        slot_valid = slot_valid.at[:, slot].set(True)
        mask = (slot_valid & (jnp.arange(s) <= slot))[:, None, :]
        token, cache = step(params, token[:, None], next_pos[:, None], mask, cache, slot)
        next_pos = next_pos + 1
    return np.asarray(jnp.stack(out, axis=1))


@pytest.fixture
def hf_fixtures() -> Path:
    """tests/fixtures/hf: one Hugging Face folder per family, plus reference/."""
    return HF_FIXTURES


@pytest.fixture(name="hf_reference")
def hf_reference_fixture():
    """hf_reference(name) -> (reference arrays, reference json)."""
    return hf_reference


@pytest.fixture(name="greedy_generate")
def greedy_generate_fixture():
    """greedy_generate(model, prompt_ids, prompt_mask, max_new_tokens, eos_ids, pad_id)."""
    return greedy_generate
