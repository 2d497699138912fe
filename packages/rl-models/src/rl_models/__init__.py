"""rl_models: Flax NNX decoder-only transformers and tokenizers."""

from rl_models.char_tokenizer import CharTokenizer
from rl_models.config import PRESETS, RopeScaling, TransformerConfig, preset
from rl_models.transformer import KVCache, Transformer

__all__ = [
    "PRESETS",
    "CharTokenizer",
    "KVCache",
    "RopeScaling",
    "Transformer",
    "TransformerConfig",
    "preset",
]
