"""Real sizes of the newest families (tests/fixtures/hf_configs, config only, README there says
where each came from): the project's reader counts the parameters transformers counts.

transformers' counts, computed once in a venv with transformers 5.25.0 and torch (meta device):
  config = AutoConfig.from_pretrained(DIR); config = getattr(config, "text_config", config)
  with torch.device("meta"): model = AutoModelForCausalLM.from_config(config)
  sum(p.numel() for p in model.parameters())          # tied weights counted once
"""

from pathlib import Path

import jax
import pytest
from flax import nnx

from rl_models import model_class
from rl_models.hf import load_hf_config

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"


def _count(config) -> int:
    """Parameters of the model the loader builds (the hybrid class for Qwen3.5-MoE), without weights."""
    state = nnx.state(nnx.eval_shape(lambda: model_class(config)(config, rngs=nnx.Rngs(0))))
    return sum(x.size for x in jax.tree.leaves(state))


@pytest.mark.parametrize(("name", "count"), [
    ("phi-4-mini-instruct", 3_836_021_760),        # Phi3ForCausalLM, tied: the model card's 3.8B
    ("olmo-2-1124-7b", 7_298_617_344),             # Olmo2ForCausalLM: OLMo 2 7B's 7.30B
    ("olmo-3-1025-7b", 7_298_011_136),             # Olmo3ForCausalLM (vocabulary 100278)
    ("qwen3.5-35b-a3b-defaults", 34_660_610_688),  # Qwen3_5MoeForCausalLM of the text_config
])
def test_newest_family_sizes_count_as_transformers_counts(name, count):
    assert _count(load_hf_config(CONFIGS / name)) == count


def test_qwen35_moe_defaults_are_the_35b_a3b_shape():
    config = load_hf_config(CONFIGS / "qwen3.5-35b-a3b-defaults")
    assert (config.num_layers, config.num_experts, config.experts_per_token, config.moe_hidden_size) == (40, 256, 8, 512)
    assert config.kinds().count("linear_attention") == 30  # three linear-attention layers to one full
