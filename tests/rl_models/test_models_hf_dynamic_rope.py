"""Dynamic NTK rope ("dynamic") is the default rope up to the folder's max_position_embeddings.

transformers 5.25 (`dynamic_rope_update`) keeps the default frequencies while a call's longest
position stays within max_position_embeddings: the llama_bias fixture with rope_scaling
{"rope_type": "dynamic", "factor": 4} and max_position_embeddings 64 gives, in transformers, its
reference logits (made with the default rope) with a max difference of 0.0
(docs/results/2026-12-05-dense-biases.md). Past the limit it recomputes every position's
frequencies from the call's length, which no cached decode matches, so longer runs are refused
(rl_models.rope_types.DynamicNTKRope, trainer.checks.check_positions).
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from rl_models.config import TransformerConfig
from rl_models.hf import HFFolderError, export_hf, load_hf_config, load_hf_model
from rl_models.rope_types import DynamicNTKRope
from tolerances import close


def dynamic_folder(hf_copy, limit=64, **rope):
    folder = hf_copy("llama_bias")
    config = json.loads((folder / "config.json").read_text())
    config.pop("rope_parameters", None)
    config |= {"rope_theta": 10000.0, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0} | rope,
               "max_position_embeddings": limit}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_dynamic_rope_loads_as_the_default_rope_within_its_limit(hf_copy, hf_reference):
    folder = dynamic_folder(hf_copy)
    model = load_hf_model(folder)
    assert model.config.rope_scaling == DynamicNTKRope(factor=4.0, max_position_embeddings=64)
    arrays, _ = hf_reference("llama_bias")
    valid = np.asarray(arrays["attention_mask"], bool)
    mask = jnp.tril(jnp.ones((12, 12), bool))[None] & jnp.asarray(valid)[:, None, :]
    hidden, _ = model(jnp.asarray(arrays["input_ids"]), jnp.asarray(arrays["position_ids"]), mask)
    np.testing.assert_allclose(np.asarray(model.logits(hidden))[valid], arrays["logits"][valid], **close(atol=1e-4, rtol=1e-4, of="model logits"))


def test_a_run_past_the_limit_is_refused_with_what_to_set_instead():
    config = TransformerConfig.tiny(40, rope_scaling=DynamicNTKRope(factor=4.0, max_position_embeddings=64))
    assert config.position_problem(64) is None
    assert config.position_problem(65) == (
        "sequences of up to 65 tokens pass the model's max_position_embeddings (64), past which dynamic NTK rope "
        "recomputes every position's frequencies from the call's length (training and decoding would rotate keys "
        "differently); keep prompt + completion within 64 tokens, or set the folder's rope_scaling to a fixed type "
        "(\"yarn\" or \"linear\") for longer contexts")
    assert TransformerConfig.tiny(40).position_problem(10**6) is None  # fixed frequencies: any length


def test_export_writes_dynamic_rope_and_its_limit_back(hf_copy, tmp_path):
    model = load_hf_model(dynamic_folder(hf_copy, limit=128))
    written = json.loads((export_hf(model, tmp_path / "out") / "config.json").read_text())
    assert written["rope_scaling"] == {"rope_type": "dynamic", "factor": 4.0}
    assert written["max_position_embeddings"] == 128
    assert load_hf_config(tmp_path / "out") == model.config


def test_dynamic_rope_without_max_position_embeddings_is_refused(hf_copy):
    folder = dynamic_folder(hf_copy)
    config = json.loads((folder / "config.json").read_text())
    del config["max_position_embeddings"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFFolderError, match=r"rope_scaling of rope_type 'dynamic' needs max_position_embeddings"):
        load_hf_config(folder)
