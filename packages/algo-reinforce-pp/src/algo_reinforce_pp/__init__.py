"""REINFORCE++-baseline (Hu et al. 2025, "REINFORCE++", arXiv:2501.03262).

Changes from GRPO:
1. Advantage: A_i = r_i - mean_group(r) (the group mean is the baseline, no
   group std), then normalised over the whole batch: (A - mean_B(A)) / (std_B(A) + 1e-6).
   A global scale instead of a per-prompt one: prompts that are almost always
   right or wrong are not up-weighted. Each group is centred, so mean_B(A) is 0
   up to rounding; rows exactly at their group's mean (every row of a tied
   group) keep exactly 0.
2. KL as a loss term with the k2 estimator, (log pi - log pi_ref)^2 / 2 per token:
   its gradient E_pi[(log pi - log pi_ref) grad log pi] is exactly the gradient of
   KL(pi || pi_ref), while k3 as a loss differentiates to the forward KL(pi_ref || pi).
   beta = 1e-3.
3. Token-level loss: "token-mean" over every token of the batch.
"""

import dataclasses

import jax.numpy as jnp

from algo_grpo import GRPOConfig, GRPOLearner
from rl_core import Algorithm, group_centered, GRPO_STD_EPS


def reinforce_pp_advantages(rewards, group_size):
    """Group-centred rewards normalised by the batch mean and std [B]; exactly 0 for tied groups."""
    centred = group_centered(rewards, group_size)
    return jnp.where(centred == 0, 0.0, (centred - jnp.mean(centred)) / (jnp.std(centred) + GRPO_STD_EPS))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReinforcePPConfig(GRPOConfig):
    """GRPOConfig with REINFORCE++-baseline's changes as defaults."""

    advantage_estimator: str = "reinforce_pp"
    kl_estimator: str = "k2"
    beta: float = 1e-3
    loss_agg_mode: str = "token-mean"


class ReinforcePPLearner(GRPOLearner):
    """REINFORCE++-baseline (arXiv:2501.03262): the GRPO learner with batch-normalised advantages."""


ALGORITHM = Algorithm(name="reinforce_pp", config=ReinforcePPConfig, learner=ReinforcePPLearner,
                      functions={"advantage_estimator": {"reinforce_pp": reinforce_pp_advantages}})
