"""rl_models: Flax NNX decoder-only transformers and tokenizers."""
