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

# The names the apps and algorithm packages import from this wing (loaded on first use, so importing the wing stays light).
from rl_core._faces import lazy_face  # noqa: E402

__getattr__, __dir__, _LAZY = lazy_face(__name__, {
    "rl_core.episodes.agents": ("AgentError", "EpisodeLog", "Turn", "agent_row", "agent_runtime", "load_agent"),
    "rl_core.episodes.runner": ("Rollout", "turn_reward_tokens"),
    "rl_core.episodes.scripted": ("first_turn_episodes", "scripted_episode"),
    "rl_core.episodes.tools": ("MAX_RESULT_CHARS", "TagCalls", "Tool", "ToolEnvironment"),
})
__all__ = [*__all__, *_LAZY]
