"""What a rollout backend does beyond the protocol's minimum: what callers branch on, never a name.

A built backend declares its `capabilities`; before one is built, its engine's record declares
what it offers (`rl_core.rollout.engines.Engine.offers`), which a run's settings are checked
against. This module imports nothing, so a config can read a record cheaply.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What a backend does beyond the protocol's minimum; callers branch on these only."""

    row_limits: bool = False
    """It stops each sample at its prompt's `Requests.max_new_tokens` and `stop_strings`, and any
    number of rows runs the same program (a caller need not pad them). False: it decodes every row
    to its own length and the caller cuts what it keeps."""
    retains: bool = False
    """It keeps the sequences of rows with `Requests.sessions` handles for a next request to continue
    (`new_sessions`, `release`). False: `new_sessions` gives -1 handles (nothing held)."""
    keeps_reference: bool = False
    """It samples from the very arrays `update_weights` was given (a caller that goes on updating
    them in place, donating their buffers, hands it a copy)."""
    takes_published: bool = False
    """`publish` reaches a running rollout: its following device calls decode with the newer weights
    (the paged engine with rollout.partial_rollouts on). An engine that offers it takes
    rollout.partial_rollouts."""
    counts_prefill: bool = False
    """`counters()` counts the prompt tokens it prefilled and reused."""
    routing: bool = False
    """Its completions record a mixture of experts' routing (`Completions.routing`: what
    algorithm.routing_replay=rollout replays)."""
