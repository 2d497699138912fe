"""The paged engine's settings: one spelling for a run's `rollout.options`, the engine and `trainer serve`.

`PagedSettings` is what a user tunes (`rollout.options.page_size=32` with `rollout.engine=paged`;
`trainer serve --page-size 32`); `EngineSettings` is what the engine is built with: those plus the
lengths the run or the endpoint fixes. This module imports nothing heavy, so a config can be
checked against it before any engine is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rl_core.config import Config, check

ATTENTION = ("auto", "reference", "pallas")
TPU_PAGE_SIZE = 64
"""Tokens a page on TPU: its kernels copy a page per DMA, and 64 ran the 0.5B shape faster than 16 or 128 on a
v5e (docs/results/2026-12-06-tpu-chip.md)."""
PAGE_SIZE = 16
"""Tokens a page elsewhere."""


def default_page_size(platform: str) -> int:
    """`page_size = 0`'s tokens a page on `platform` (a JAX backend name)."""
    return TPU_PAGE_SIZE if platform == "tpu" else PAGE_SIZE


@dataclasses.dataclass(frozen=True, kw_only=True)
class PagedSettings(Config):
    """The paged engine's knobs, per replica (one replica per data/fsdp device)."""

    page_size: int = 0
    """Tokens per KV page; 0: the platform's (64 on TPU, 16 elsewhere: `default_page_size`), fixed when the
    engine's settings are built."""
    slots: int = 64
    """Sequences decoded together by each replica; a finished one's slot takes the next waiting one
    (a run caps it at the replica's share of the rollout's completions)."""
    prefill_chunk: int = 64
    """Prompt tokens prefilled per device call, interleaved with decoding."""
    steps_per_sync: int = 8
    """Decode steps per device call (the host refills slots between calls)."""
    num_pages: int = 0
    """Pages in each replica's KV pool; 0 sizes it so that every slot can reach max_new_tokens with its
    prompt and the next prompts' prefill (never preempts). Smaller pools preempt and recompute the
    youngest sequence when they run out."""
    attention: str = "auto"
    """"auto" (Pallas kernels on TPU/GPU, plain JAX on CPU), "reference" (plain JAX everywhere) or "pallas"."""
    state_rows: int = 0
    """Rows of each replica's state pool (recurrent states, windowed layers' rings); 0: 2 * slots + 2."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.page_size >= 0, self, "page_size", "must be >= 0 (0 = the platform's)")
        for name in ("slots", "prefill_chunk", "steps_per_sync"):
            check(getattr(self, name) >= 1, self, name, "must be >= 1")
        check(self.num_pages >= 0, self, "num_pages", "must be >= 0 (0 = sized for the batch)")
        check(self.state_rows >= 0, self, "state_rows", "must be >= 0 (0 = 2 * slots + 2)")
        check(self.attention in ATTENTION, self, "attention", f"must be one of {ATTENTION}")

    def knobs(self) -> dict[str, Any]:
        """These settings alone (a subclass's own fields left out), as `PagedSettings` keywords."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(PagedSettings)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineSettings(PagedSettings):
    """What the engine is built with: its knobs and the lengths its caller fixes (one compiled program
    per settings and sampling parameters)."""

    max_prompt_tokens: int
    max_new_tokens: int
    top_logprobs: int = 0
    """K: each token's K likeliest alternatives and their log-probs (the OpenAI endpoint's)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.page_size == 0:  # the engine runs on this host's backend (a TPU program lowered on a CPU host names its own)
            import jax  # noqa: PLC0415 (the settings alone import nothing heavy)

            object.__setattr__(self, "page_size", default_page_size(jax.default_backend()))
        check(self.max_prompt_tokens >= 1, self, "max_prompt_tokens", "must be >= 1")
        check(self.max_new_tokens >= 1, self, "max_new_tokens", "must be >= 1")
        check(self.top_logprobs >= 0, self, "top_logprobs", "must be >= 0 (0 = none)")

    @classmethod
    def from_rollout(cls, rollout: Any, *, batch_size: int | None = None, replicas: int = 1,
                     knobs: Any = None) -> EngineSettings:
        """The shapes (per replica) a run's rollout settings ask for: its engine's `PagedSettings`
        (`rollout.options`) and its lengths; `batch_size` (completions per rollout, shared by `replicas`
        replicas) caps each replica's slots, since more slots than completions would only idle.

        Prompts get one token of room beyond max_prompt_tokens (a BOS the tokenizer adds); with an
        environment or an agent, a later turn's prompt is the episode so far, up to max_new_tokens longer.
        `knobs`: the engine's settings already built from `rollout.options` (None: built here)."""
        knobs = rollout.engine_settings() if knobs is None else knobs
        knobs = knobs.knobs() if isinstance(knobs, PagedSettings) else {}
        episodes = rollout.environment is not None or rollout.agent is not None
        slots = knobs.get("slots", PagedSettings.slots)
        if batch_size is not None:
            slots = min(slots, -(-batch_size // replicas))
        return cls(**(knobs | {"slots": slots}),
                   max_prompt_tokens=rollout.max_prompt_tokens + 1 + (rollout.max_new_tokens if episodes else 0),
                   max_new_tokens=rollout.max_new_tokens)

    @property
    def pages_per_sequence(self) -> int:  # M: the longest prompt plus every new token
        return -(-(self.max_prompt_tokens + self.max_new_tokens) // self.page_size)

    @property
    def state_pool_rows(self) -> int:
        """Rows of a replica's state pool: a scratch row, one per running sample, the rest for the
        prompts their samples copy from and for retained sequences (rl_core.rollout.replica)."""
        return self.state_rows or 2 * self.slots + 2

    @property
    def pool_pages(self) -> int:
        if self.num_pages:
            return self.num_pages
        prefixes = -(-self.max_prompt_tokens // self.page_size) * self.slots  # prompts waiting for slots
        return 1 + self.slots * (self.pages_per_sequence + 1) + prefixes
