"""GSPO: Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071).

Changes from GRPO:
1. Sequence-level importance ratio s_i = exp((1/|y_i|) sum_t (log pi_theta - log pi_old)),
   the geometric mean of the token ratios, with |y_i| = sum_t mask[i, t]: the
   unit of the reward (a whole completion) is the unit of off-policy correction.
2. Clipping per sequence: -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i),
   with the paper's eps_low = 3e-4, eps_high = 4e-4 (s_i moves far less than a token ratio).
3. The loss is one term per sequence, averaged over sequences ("seq-mean-token-mean"
   gives mean_i of a per-sequence term; rl_core.math.aggregation states the rule).
4. beta = 0: the paper's objective has no KL term.

GRPO's group-normalised advantages are kept. `policy_loss = "gspo_token"` is the
paper's GSPO-token form: token ratio sg(s_i) * pi_theta(y_t) / sg(pi_theta(y_t)),
equal to s_i in value (so the same loss and clipping), whose gradient also
accepts per-token advantages [B, T].
"""

import dataclasses

import jax
import jax.numpy as jnp

from algo_grpo import GRPOConfig, GRPOLearner
from rl_core import Algorithm, clipped_surrogate, log_ratio


def sequence_log_ratio(logp, old_logp, mask):
    """log s_i = (1/|y_i|) sum_t (logp - old_logp) over real tokens [B]; 0 for a row without any."""
    return jnp.sum(log_ratio(logp, old_logp, mask), axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)


def gspo_loss(logp, old_logp, adv, mask, *, eps_low, eps_high, dual_clip=None):
    """-min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i) per sequence [B], with its diagnostics [B]."""
    log_s = sequence_log_ratio(logp, old_logp, mask)[:, None]  # each sequence as one "token"
    zero, one = jnp.zeros_like(log_s), jnp.ones_like(log_s)  # old log-ratio 0, mask 1
    loss, aux = clipped_surrogate(log_s, zero, adv, one, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)
    return loss[:, 0], jax.tree.map(lambda x: x[:, 0], aux)


def gspo_token_loss(logp, old_logp, adv, mask, *, eps_low, eps_high, dual_clip=None):
    """GSPO-token per token [B, T]: ratio sg(s_i) * pi_t / sg(pi_t); adv [B] or [B, T]."""
    log_s = jax.lax.stop_gradient(sequence_log_ratio(logp, old_logp, mask))[:, None]
    token = log_s + (logp - jax.lax.stop_gradient(logp))  # value log s_i, gradient d log pi_t
    zero = jnp.zeros_like(token)
    return clipped_surrogate(token, zero, adv, mask, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GSPOConfig(GRPOConfig):
    """GRPOConfig with GSPO's changes as defaults."""

    policy_loss: str = "gspo"
    epsilon_low: float = 3e-4
    epsilon_high: float = 4e-4
    beta: float = 0.0


class GSPOLearner(GRPOLearner):
    """GSPO (arXiv:2507.18071): the GRPO learner with the sequence-level policy loss."""


ALGORITHM = Algorithm(
    name="gspo",
    config=GSPOConfig,
    learner=GSPOLearner,
    functions={"policy_loss": {"gspo": gspo_loss, "gspo_token": gspo_token_loss}},
)
