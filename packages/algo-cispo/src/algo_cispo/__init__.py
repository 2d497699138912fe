"""CISPO: Clipped IS-weight Policy Optimization (MiniMax-M1, MiniMax et al. 2025, arXiv:2506.13585).

Changes from GRPO:
1. The importance-sampling weight is clipped and detached instead of the token
   update: per token  -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_i * log pi_theta(y_t),
   so every token keeps its gradient sg(w_t) A_i grad log pi_theta(y_t), clipped ones
   included (PPO/GRPO's clip zeroes the gradient of tokens outside the range, which
   drops rare "reflection" tokens).
2. No lower bound on the weight: the paper sets eps_low "to a large value"; here
   eps_low = 1, so 1 - eps_low = 0 and a positive ratio never hits it. The paper
   tunes eps_high without publishing it; 0.28 is DAPO's clip-higher value, which
   open reproductions of CISPO use too.
3. Token-level loss: "token-mean" over every token of the batch.
4. beta = 0: no KL term, so no reference model runs.

GRPO's group-normalised advantages are kept.
"""

import dataclasses

import jax
import jax.numpy as jnp

from algo_grpo import GRPOConfig, GRPOLearner
from rl_core import Algorithm, check, log_ratio, token_advantages
from rl_core.math import PolicyLossAux


def cispo_loss(logp, old_logp, adv, mask, *, eps_low, eps_high, dual_clip=None):
    """-sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A * log pi_t per token [B, T], with diagnostics."""
    if dual_clip is not None:
        raise ValueError("CISPO has no dual clip: its weight is already bounded by 1 + eps_high")
    ratio = jax.lax.stop_gradient(jnp.exp(log_ratio(logp, old_logp, mask)))
    weight = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = -weight * token_advantages(adv, logp) * jnp.where(mask > 0, logp, 0.0)
    low, high = (ratio < 1.0 - eps_low).astype(ratio.dtype), (ratio > 1.0 + eps_high).astype(ratio.dtype)
    return loss, PolicyLossAux(ratio=ratio, clipped_low=low, clipped_high=high, dual_clipped=0 * low)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CISPOConfig(GRPOConfig):
    """GRPOConfig with CISPO's changes as defaults."""

    policy_loss: str = "cispo"
    epsilon_low: float = 1.0
    epsilon_high: float = 0.28
    loss_agg_mode: str = "token-mean"
    beta: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.dual_clip is None, self, "dual_clip", "CISPO has no dual clip; must be None")


class CISPOLearner(GRPOLearner):
    """CISPO (arXiv:2506.13585): the GRPO learner with the clipped-IS-weight policy loss."""


ALGORITHM = Algorithm(
    name="cispo", config=CISPOConfig, learner=CISPOLearner, functions={"policy_loss": {"cispo": cispo_loss}}
)
