"""On-policy distillation's per-token signal: the reverse KL to a teacher on the student's own tokens.

The student samples y; a frozen teacher scores the same tokens; each token's advantage is the
negative of the sampled reverse-KL estimate, log pi(y_t) - log pi_T(y_t), scaled by `coef`, added
to whatever advantage the run's estimator gave the completion (0 for distillation alone):

    A_t = A + coef * (log pi_T(y_t) - log pi_old(y_t))

Sources: Thinking Machines, "On-Policy Distillation" (Lu et al. 2025; the Tinker cookbook's
`incorporate_kl_penalty`: advantages -= kl_coef * (sampled logprobs - teacher logprobs), per
token, discount 0); slime's `--opd-kl-coef` (docs/en/advanced/on-policy-distillation.md:
A_hat_t = A_t - lambda_opd * KL_t, beside any estimator); GKD (Agarwal et al. 2024,
arXiv:2306.13649), on-policy student samples with the reverse KL as the divergence.

pi_old is the policy that sampled y (`old_logp`; on a provably on-policy step stop_gradient(logp),
equal in value, rl_core.train.behaviour), so the term is a fixed per-token reward, never
differentiated. Tinker subtracts the sampler's log-probs; this takes the trainer's own pass of the
same policy, which the teacher's log-probs come from too, so that a student equal to its teacher
gets exactly 0 (the two differ only by the sampler/trainer mismatch, rl_core.correction_config).
With the policy-gradient loss -A_t * r_t, r_t = pi / pi_old, its gradient at r = 1 is
coef * (log pi(y_t) - log pi_T(y_t)) * grad log pi(y_t): in expectation over y_t ~ pi, coef times
the gradient of the token's reverse KL(pi || pi_T) (the score-function estimator; E[grad log pi] = 0).
Where the student equals the teacher every term, and so the loss and its gradient, is 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sampled_reverse_kl(old_logp: jax.Array, teacher_logp: jax.Array) -> jax.Array:
    """log pi_old(y_t) - log pi_T(y_t) per token [B, T]: the one-sample estimate of KL(pi || pi_T)."""
    if jnp.shape(old_logp) != jnp.shape(teacher_logp):
        raise ValueError(f"old_logp {jnp.shape(old_logp)} and teacher_logp {jnp.shape(teacher_logp)} "
                         "must have the same shape [B, T]")
    return old_logp - teacher_logp


def distill_advantages(adv: jax.Array, old_logp: jax.Array, teacher_logp: jax.Array, mask: jax.Array, *,
                       coef: float) -> jax.Array:
    """A_t = A + coef * (log pi_T(y_t) - log pi_old(y_t)) per token [B, T], no gradient, 0 where
    mask is 0; `adv` [B] (one per completion) or [B, T]."""
    adv = jnp.asarray(adv)
    adv = adv[:, None] if adv.ndim == 1 else adv
    kl = jax.lax.stop_gradient(sampled_reverse_kl(old_logp, teacher_logp))
    return jnp.where(mask > 0, adv - coef * kl, 0.0)
