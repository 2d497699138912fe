"""The learner: the base RL learner, its state, the rollout/update pipeline, groups and meters."""

# The names the apps and algorithm packages import from this wing (loaded on first use, so importing the wing stays light).
from rl_core._faces import lazy_face  # noqa: E402

__getattr__, __dir__, _LAZY = lazy_face(__name__, {
    "rl_core.learner.base": ("StepBatch",),
    "rl_core.learner.groups": ("TOTAL", "concat"),
    "rl_core.learner.reward_audit": ("RewardAudit",),
    "rl_core.learner.state": ("LearnerState", "carry_from_json", "carry_to_json", "state_arrays"),
})
__all__ = sorted(_LAZY)
