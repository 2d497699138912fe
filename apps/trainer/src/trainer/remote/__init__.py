"""Rollouts on engine servers: the `remote` engine (trainer.remote.engine), the weights it
publishes by version (trainer.remote.weights) and the token-level routes a `trainer serve`
process answers (trainer.remote.routes)."""
