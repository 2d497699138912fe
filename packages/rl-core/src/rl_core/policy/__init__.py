"""The policy side: model protocols, log-probabilities, tokenization, frozen references, values."""
