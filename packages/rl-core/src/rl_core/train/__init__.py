"""Training steps: trainable state, optimizers, batch layout, packing, trimming, the objective, update stats."""
