"""Episodes: multi-turn rollouts with environments and tools (see `env`, `tools`, `runner`)."""

from rl_core.episodes.env import JSON, ContractError, Environment, EnvironmentFactory, StepResult
from rl_core.registry import environment_names, get_environment, register_environment
from rl_core.episodes.runner import (
    ENVIRONMENT,
    MODEL,
    EpisodeLimits,
    EpisodeRecord,
    Rollout,
    episode_metrics,
    run_episodes,
    single_turn,
)

__all__ = [
    "ENVIRONMENT",
    "JSON",
    "MODEL",
    "ContractError",
    "Environment",
    "EnvironmentFactory",
    "EpisodeLimits",
    "EpisodeRecord",
    "Rollout",
    "StepResult",
    "environment_names",
    "episode_metrics",
    "get_environment",
    "register_environment",
    "run_episodes",
    "single_turn",
]
