"""rl_models: Flax NNX decoder-only transformers and tokenizers.

Hugging Face checkpoints are read and written by the `rl_models.hf` subpackage
(imported explicitly: `from rl_models.hf import load_hf_model, load_hf_tokenizer`).
"""

from rl_models.char_tokenizer import CharTokenizer
from rl_models.config import PRESETS, LinearAttention, RopeScaling, TransformerConfig, preset
from rl_models.hybrid import HybridTransformer, model_class
from rl_models.paged import PAGED_TRANSFORMER, TransformerPaging
from rl_models.transformer import KVCache, Transformer
from rl_models.value import ValueModel, value_model_from_policy

__all__ = [
    "PAGED_TRANSFORMER",
    "PRESETS",
    "CharTokenizer",
    "HybridTransformer",
    "KVCache",
    "LinearAttention",
    "RopeScaling",
    "Transformer",
    "TransformerConfig",
    "TransformerPaging",
    "ValueModel",
    "model_class",
    "preset",
    "value_model_from_policy",
]
