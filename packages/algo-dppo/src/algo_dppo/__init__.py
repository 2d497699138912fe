"""DPPO: Divergence Proximal Policy Optimization (Qi et al. 2026, "Rethinking the Trust Region
in LLM Reinforcement Learning", arXiv:2602.04879; code: sail-sg/Stable-RL).

Source of the formula: verl's `compute_policy_loss_dppo_tv` / `compute_policy_loss_dppo_kl`
(verl-project/verl, verl/trainer/ppo/core_algos.py, registered as "dppo_tv" / "dppo_kl"),
the paper's Binary-TV and Binary-KL approximations. Per sampled token, with p = pi_theta(y_t),
q = pi_old(y_t), r_t = p / q (log-ratio bounded to +-20):

    binary TV:  valid_t = p - q <= delta_high        if A_t > 0
                valid_t = p - q >= -delta_low        otherwise
    binary KL:  D_t = q log(q / p) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8))
                valid_t = D_t <= delta_high or p <= q    if A_t > 0
                valid_t = D_t <= delta_low  or p >= q    otherwise
    l_t = -A_t * sg(min(r_t, C)) * log pi_theta(y_t) * sg(valid_t)

The divergence between the old and new token distributions, collapsed to the binary
{y_t, not y_t}, replaces PPO's ratio as the trust region: a token that left it in the
direction its advantage pushes gets no gradient; inside it, the gradient is the
importance-weighted policy gradient -A r_t grad log pi (the value carries log pi, as CISPO's).
C truncates the weight (the paper's section 5.4: a large C; verl's example runs 10000).

Changes from GRPO:
1. The policy loss above, `policy_loss = "dppo_tv"` (or "dppo_kl"); epsilon_low/epsilon_high
   are the divergence thresholds delta_low/delta_high, as verl's clip_ratio_low/high are:
   0.15 for TV (the default), 0.05 for KL (set both when choosing "dppo_kl").
2. dual_clip is the weight's truncation C (verl's clip_ratio_c); None: no truncation.
3. Token-level loss, "token-mean" (the reference function's default), and beta = 0.
GRPO's group-normalised advantages are kept.

Diagnostics: `clipped_high` / `clipped_low` flag masked-out tokens with A > 0 / A < 0,
`dual_clipped` valid tokens whose weight hit C.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from algo_grpo import GRPOConfig, GRPOLearner
from rl_core.math import PolicyLossAux
from rl_core import Algorithm, log_ratio, token_advantages


def binary_tv_valid(logp, old_logp, a, eps_low, eps_high):
    """Inside the binary-TV trust region: p - q <= delta_high for A > 0, >= -delta_low otherwise."""
    p, q = jnp.exp(logp), jnp.exp(old_logp)
    return jnp.where(a > 0, p - q <= eps_high, p - q >= -eps_low)


def binary_kl_valid(logp, old_logp, a, eps_low, eps_high):
    """Inside the binary-KL trust region, or moved against the advantage's push."""
    p, q = jnp.exp(logp), jnp.exp(old_logp)
    kl = q * (old_logp - logp) + (1 - q) * jnp.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8))
    return jnp.where(a > 0, (kl <= eps_high) | (p <= q), (kl <= eps_low) | (p >= q))


def dppo_loss(valid_fn, logp, old_logp, adv, mask, *, eps_low, eps_high, dual_clip=None):
    """-A * sg(min(r, C)) * log pi * valid per token [B, T], with diagnostics; C = dual_clip (None: inf)."""
    ratio = jnp.exp(log_ratio(logp, old_logp, mask))
    a = token_advantages(adv, logp).astype(ratio.dtype)
    lp, old = jnp.where(mask > 0, logp, 0.0), jnp.where(mask > 0, old_logp, 0.0)  # padding: p = q = 1
    valid = valid_fn(lp, old, a, eps_low, eps_high)  # a boolean mask: no gradient flows through it
    cap = jnp.inf if dual_clip is None else dual_clip
    loss = -a * jax.lax.stop_gradient(jnp.minimum(ratio, cap)) * lp * valid
    flags = [~valid & (a < 0), ~valid & (a > 0), valid & (ratio > cap)]
    return loss, PolicyLossAux(ratio, *(f.astype(ratio.dtype) for f in flags))


dppo_tv_loss = functools.partial(dppo_loss, binary_tv_valid)
"""DPPO-Binary-TV (verl "dppo_tv")."""
dppo_kl_loss = functools.partial(dppo_loss, binary_kl_valid)
"""DPPO-Binary-KL (verl "dppo_kl")."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPPOConfig(GRPOConfig):
    """GRPOConfig with DPPO's changes as defaults (Binary-TV, delta = 0.15)."""

    policy_loss: str = "dppo_tv"
    epsilon_low: float = 0.15
    epsilon_high: float = 0.15
    loss_agg_mode: str = "token-mean"
    beta: float = 0.0


class DPPOLearner(GRPOLearner):
    """DPPO (arXiv:2602.04879): the GRPO learner with the divergence-masked policy loss."""


ALGORITHM = Algorithm(
    name="dppo",
    config=DPPOConfig,
    learner=DPPOLearner,
    functions={"policy_loss": {"dppo_tv": dppo_tv_loss, "dppo_kl": dppo_kl_loss}},
)
