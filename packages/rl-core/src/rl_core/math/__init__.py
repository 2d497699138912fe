"""Pure math: advantages, returns, policy and value losses, KL estimators, loss aggregation."""

# The names the apps and algorithm packages import from this wing (loaded on first use, so importing the wing stays light).
from rl_core._faces import lazy_face  # noqa: E402

__getattr__, __dir__, _LAZY = lazy_face(__name__, {
    "rl_core.math.policy_losses": ("PolicyLossAux",),
})
__all__ = sorted(_LAZY)
