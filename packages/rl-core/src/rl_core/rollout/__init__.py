"""Rollout backends: the protocol (`backend`), the static sampler (`static`) and the
paged continuous-batching engine (`paged`)."""
