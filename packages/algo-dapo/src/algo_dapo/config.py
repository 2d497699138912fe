"""DAPOConfig: GRPO's config with DAPO's four changes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from algo_grpo import GRPOConfig
from rl_core import check, Config
from rl_core.learner import TOTAL

from algo_dapo.overlong import overlong_penalty

ON_MAX_GEN_BATCHES = ("partial", "raise")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OverlongConfig(Config):
    """Soft overlong punishment (DAPO section 3.4)."""

    enabled: bool = True
    """Add the overlong penalty to the task's rewards."""
    max_tokens: int | None = None
    """L_max in tokens; None = the rollout's max_new_tokens."""
    cache_tokens: int | None = None
    """L_cache: the buffer before L_max over which the penalty ramps from 0 to -1;
    None = L_max // 5 (the paper's 4096 of 20480), at least 1."""
    penalty_factor: float = 1.0
    """Scale of the penalty."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.max_tokens is None or self.max_tokens >= 1, self, "max_tokens", "must be >= 1 or None")
        check(self.cache_tokens is None or self.cache_tokens >= 1, self, "cache_tokens", "must be >= 1 or None")
        if self.max_tokens is not None and self.cache_tokens is not None:
            check(self.cache_tokens <= self.max_tokens, self, "cache_tokens", f"must be <= max_tokens ({self.max_tokens})")
        check(self.penalty_factor >= 0, self, "penalty_factor", "must be >= 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DAPOConfig(GRPOConfig):
    """DAPO (Yu et al. 2025, arXiv:2503.14476)."""

    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    beta: float = 0.0
    loss_agg_mode: str = "token-mean"
    dynamic_sampling: bool = True
    """Drop uninformative groups (see `filter_reward`) and sample new prompts until B informative groups exist."""
    filter_reward: str | None = None
    """What dynamic sampling judges a group by: a reward function's name, "total" (the weighted
    sum, shaping terms included), or None = the reward manager's correctness function. A group is
    kept when its scores differ; for a 0/1 correctness reward that is the paper's 0 < #correct < G."""
    max_gen_batches: int = 4
    """Cap on generation rounds per step (each round samples B prompts)."""
    on_max_gen_batches: str = "partial"
    """At the cap: 'partial' trains on the informative groups collected (the rest masked out), 'raise' stops."""
    overlong: OverlongConfig = dataclasses.field(default_factory=OverlongConfig)
    """Soft overlong punishment settings."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.max_gen_batches >= 1, self, "max_gen_batches", "must be >= 1")
        check(self.filter_reward is None or bool(self.filter_reward), self, "filter_reward", "must be a name or None")
        check(
            self.on_max_gen_batches in ON_MAX_GEN_BATCHES,
            self,
            "on_max_gen_batches",
            f"must be one of {ON_MAX_GEN_BATCHES}",
        )

    def check_reward_names(self, names: Sequence[str]) -> None:
        super().check_reward_names(names)
        check(self.filter_reward in (None, TOTAL, *names), self, "filter_reward",
              f"must name one of the run's reward functions {[TOTAL, *names]}, or be null (the correctness reward)")

    def reward_functions(self, *, max_new_tokens: int) -> tuple[Callable[..., list[float]], ...]:
        if not self.overlong.enabled:
            return ()
        max_tokens = self.overlong.max_tokens or max_new_tokens
        cache_tokens = self.overlong.cache_tokens or max(1, max_tokens // 5)
        return (
            overlong_penalty(
                max_tokens=max_tokens,
                cache_tokens=cache_tokens,
                penalty_factor=self.overlong.penalty_factor,
            ),
        )
