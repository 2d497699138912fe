"""OLMo 2 and 3 beyond the parity suites (tests/rl_models/test_models_hf_parity.py and the engines'
tests/rl_core/test_core_engine_families.py run them like every family): what their block is made
of, and the folders and configs refused."""

import json

import numpy as np
import pytest
from flax import nnx

from rl_models import TransformerConfig
from rl_models.hf import HFFolderError, load_hf_config, load_hf_model
from rl_models.hf.families import infer_family
from rl_models.block import Attention


def test_olmo2_norms_only_after_the_sublayers_and_over_all_heads(hf_fixtures):
    model = load_hf_model(hf_fixtures / "olmo2")
    block = model.layers
    assert block.attn_norm is None and block.mlp_norm is None
    assert block.attn_post_norm is not None and block.mlp_post_norm is not None
    assert block.attn.q_norm.weight.shape == (2, 4 * 16) and block.attn.k_norm.weight.shape == (2, 2 * 16)


def test_the_norm_over_all_heads_is_not_each_heads():
    """The fixture's q/k norm: one RMS over the H * Dh values, which per-head norms would not give."""
    config = TransformerConfig.tiny(40, post_norms=True, qk_norm=True, qk_norm_all_heads=True)
    attn = Attention(config, rngs=nnx.Rngs(0))  # one layer's (its weights start at 1)
    q = (np.random.default_rng(0).normal(size=(1, 3, 4, 16)) * np.arange(1, 5)[:, None]).astype(np.float32)
    k = q[:, :, :2]
    normed, _ = attn.normed(q, k)
    whole = q / np.sqrt(np.mean(q.reshape(1, 3, -1) ** 2, -1) + config.rms_norm_eps)[..., None, None]
    np.testing.assert_allclose(np.asarray(normed), whole, rtol=1e-5, atol=1e-6)
    each = q / np.sqrt(np.mean(q ** 2, -1, keepdims=True) + config.rms_norm_eps)
    assert np.abs(np.asarray(normed) - each).max() > 0.1


def _edit(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))


@pytest.mark.parametrize(("changes", "message"), [
    (dict(attention_bias=True), r"unsupported attention_bias=True: olmo2's attention has no biases"),
    (dict(layer_types=["sliding_attention", "full_attention"], sliding_window=4),
     r"unsupported layer_types=\['full_attention', 'sliding_attention'\]: only full attention"),
    (dict(hidden_act="gelu"), r"unsupported hidden_act='gelu'"),
], ids=["bias", "windows", "activation"])
def test_olmo2_folders_with_settings_it_lacks_are_refused(changes, message, hf_copy):
    folder = hf_copy("olmo2")
    _edit(folder, **changes)
    with pytest.raises(HFFolderError, match=message):
        load_hf_model(folder)


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(post_norms=True), r"only OLMo 2 and 3 \(olmo2, olmo3\) have norms after the sub-layers alone"),
    (dict(qk_norm=True, qk_norm_all_heads=True), r"only OLMo 2 and 3"),
    (dict(post_norms=True, qk_norm=True, qk_norm_all_heads=True, sliding_window=4),
     r"OLMo 3 \(windowed layers\) gives its windowed layers their own unscaled rope"),
    (dict(post_norms=True, qk_norm=True, qk_norm_all_heads=True, rope_local_theta=1e4),
     r"OLMo 2 \(full attention\) has no local rope theta"),
])
def test_no_family_but_olmo_writes_its_norms(overrides, message):
    with pytest.raises(ValueError, match=message):
        infer_family(TransformerConfig.tiny(40, **overrides))


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(qk_norm_all_heads=True), r"qk_norm_all_heads=True: needs qk_norm"),
    (dict(post_norms=True, sandwich_norms=True), r"post_norms=True: and sandwich_norms exclude each other"),
])
def test_config_refuses_norm_settings_that_contradict(overrides, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig.tiny(40, **overrides)


def test_an_olmo3_folder_in_the_older_layout_reads_as_the_same_model(hf_fixtures, hf_copy):
    """rope_theta and rope_scaling (the global layers' scaling) with no layer_types: transformers'
    three windowed layers to one global, the windowed ones with the unscaled rope."""
    folder = hf_copy("olmo3")
    config = json.loads((folder / "config.json").read_text())
    full = config.pop("rope_parameters")["full_attention"]
    del config["layer_types"]
    config |= {"rope_theta": full.pop("rope_theta"), "rope_scaling": full}
    (folder / "config.json").write_text(json.dumps(config))
    assert load_hf_config(folder) == load_hf_config(hf_fixtures / "olmo3")
