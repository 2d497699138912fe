"""SAPO: Soft Adaptive Policy Optimization (Gao et al., Qwen Team 2025, arXiv:2511.20347).

Source of the formula: the paper's objective and verl's `compute_policy_loss_sapo`
(verl-project/verl, verl/trainer/ppo/core_algos.py, registered as "sapo"):

    r_t    = pi_theta(y_t) / pi_old(y_t)                 (token ratio, log-ratio bounded to +-20)
    tau_t  = tau_pos if A_t > 0 else tau_neg             (asymmetric temperatures)
    f(r)   = (4 / tau_t) * sigmoid(tau_t * (r - 1))      (the soft gate)
    l_t    = -f(r_t) * A_t
    J      = (1/G) sum_i (1/|y_i|) sum_t f(r_i,t) A_i,t  ("seq-mean-token-mean")

d l_t / d log pi_t = -4 s (1 - s) r_t A_t with s = sigmoid(tau_t (r_t - 1)): at r = 1 exactly
the unclipped policy gradient -A (4 * 1/2 * 1/2 = 1), smoothly attenuated as r leaves 1,
never cut to 0 as a hard clip does. tau_neg > tau_pos makes the gate decay faster for
negative advantages (their updates, spread over the whole vocabulary, destabilise more).

Changes from GRPO:
1. The policy loss is the soft gate above (`policy_loss = "sapo"`), not the clipped
   surrogate; epsilon_low/epsilon_high are not used. tau_pos = 1.0, tau_neg = 1.05 (the
   paper's and verl's values).
2. beta = 0: the paper's objective has no KL term.
GRPO's group-normalised advantages and "seq-mean-token-mean" aggregation are kept.

Diagnostics: no token is hard-clipped, so `clipped_high` (A > 0, r > 1) and `clipped_low`
(A < 0, r < 1), on the sides where PPO's clip would act, hold the share of the gradient
the gate removes there, 1 - 4 s (1 - s) in [0, 1) (0 at r = 1).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from algo_grpo import GRPOConfig, GRPOLearner
from rl_core import Algorithm, check, log_ratio, token_advantages
from rl_core.math import PolicyLossAux

def sapo_loss(logp, old_logp, adv, mask, *, eps_low, eps_high, dual_clip=None, tau_pos=1.0, tau_neg=1.05):
    """-(4 / tau) * sigmoid(tau * (r_t - 1)) * A per token [B, T], tau by the sign of A; eps_* unused."""
    if dual_clip is not None:
        raise ValueError("SAPO has no dual clip: its gate is bounded by 4 / tau")
    ratio = jnp.exp(log_ratio(logp, old_logp, mask))
    a = token_advantages(adv, logp).astype(ratio.dtype)
    tau = jnp.where(a > 0, tau_pos, tau_neg).astype(ratio.dtype)
    gate = jax.nn.sigmoid(tau * (ratio - 1.0))
    removed = 1.0 - 4.0 * gate * (1.0 - gate)  # the share of the gradient the gate takes away: 0 at r = 1
    low, high = (jnp.where(side, removed, 0.0) for side in ((a < 0) & (ratio < 1.0), (a > 0) & (ratio > 1.0)))
    return -(4.0 / tau) * gate * a, PolicyLossAux(ratio, clipped_low=low, clipped_high=high, dual_clipped=0 * low)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SAPOConfig(GRPOConfig):
    """GRPOConfig with SAPO's changes as defaults, and the gate's two temperatures."""

    policy_loss: str = "sapo"
    tau_pos: float = 1.0
    """Gate temperature for tokens with A > 0."""
    tau_neg: float = 1.05
    """Gate temperature for tokens with A <= 0 (larger: faster decay)."""
    beta: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.tau_pos > 0, self, "tau_pos", "must be > 0")
        check(self.tau_neg > 0, self, "tau_neg", "must be > 0")
        check(self.dual_clip is None, self, "dual_clip", "SAPO has no dual clip; must be None")


class SAPOLearner(GRPOLearner):
    """SAPO (arXiv:2511.20347): the GRPO learner with the soft-gated policy loss, at the config's temperatures."""

    @classmethod
    def loss_of(cls, config, rollout, passes):
        fn = super().loss_of(config, rollout, passes)
        gate = functools.partial(sapo_loss, tau_pos=config.tau_pos, tau_neg=config.tau_neg)
        return functools.partial(fn, policy_loss=gate) if config.policy_loss == "sapo" else fn


ALGORITHM = Algorithm(
    name="sapo", config=SAPOConfig, learner=SAPOLearner, functions={"policy_loss": {"sapo": sapo_loss}}
)
