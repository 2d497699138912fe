"""The policy-gradient objective for one micro-batch, from registered pure functions.

`policy_objective(model, example, ...)` is what the policy's jitted update differentiates
for every variant: the policy's log-probs of the example's completions, then
`policy_gradient_loss` on them. `policy_loss_function(config, rollout, beta=...)` binds a run's
settings, a pure function of the configs: rl_core.learner.pipeline.PolicyGradientLearner.loss_of
returns it (a variant that changes the loss overrides `loss_of`), and `trainer plan` compiles the
update on what `loss_of` returns without building a learner.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from rl_core import registry
from rl_core.math.aggregation import per_token
from rl_core.math.distillation import distill_advantages, sampled_reverse_kl
from rl_core.math.routing import load_balancing_loss
from rl_core.policy.logprobs import routed_completion_logprobs
from rl_core.policy.protocols import Policy
from rl_core.train.trainable import LossFn, LossOutput
from rl_core.correction_config import RolloutCorrection, resolve_correction
from rl_core.train.correction import correct_policy_terms
from rl_core.types import TrainExample

if TYPE_CHECKING:
    from rl_core.config import RolloutConfig
    from rl_core.pipeline_config import PolicyGradientConfig


def masked_sum(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum over real tokens, number of real tokens): a token-mean metric."""
    return jnp.sum(x * mask), jnp.sum(mask)


def policy_loss_function(config: PolicyGradientConfig, rollout: RolloutConfig, *, beta: float,
                         proximal: bool = False) -> LossFn:
    """`policy_objective` with a run's settings bound: the registered functions `config` names, its
    clip widths, the KL term's coefficient `beta` (0: no KL term; rl_core.train.behaviour.LogprobPasses.
    loss_beta), the sampler's temperature and the run's rollout correction (rl_core.
    correction_config.resolve_correction); `proximal` (async rollouts): old_logp is the proximal
    policy's."""
    return functools.partial(
        policy_objective,
        temperature=rollout.temperature,
        chunk_tokens=rollout.logprob_chunk_tokens,
        policy_loss=registry.get("policy_loss", config.policy_loss),
        aggregate=registry.get("loss_aggregation", config.loss_agg_mode),
        kl_estimator=registry.get("kl_estimator", config.kl_estimator) if beta else None,
        beta=beta,
        eps_low=config.epsilon_low,
        eps_high=config.epsilon_high,
        dual_clip=config.dual_clip,
        max_len=rollout.max_new_tokens,
        rollout_correction=resolve_correction(config),
        proximal=proximal,
        entropy_top_fraction=config.entropy_top_fraction,
        distill_coef=config.distill_coef,
        router_aux_coef=config.router_aux_loss_coef,
    )


def high_entropy_mask(entropy: jax.Array, mask: jax.Array, fraction: float) -> jax.Array:
    """bool [B, T]: the real tokens (mask > 0) whose entropy is at or above the (1 - fraction)-
    quantile of the real tokens' entropies, linearly interpolated as torch.quantile does.

    High-entropy token selection ("Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
    Effective RL for LLM Reasoning", Wang et al. 2025, arXiv:2506.01939), computed as TRL's
    GRPOTrainer.get_high_entropy_mask (its `top_entropy_quantile` is `fraction`): the threshold
    is taken over the micro-batch the loss sees (on a mesh: the whole micro-batch, over every
    device, as TRL gathers over processes), ties at the threshold are kept, and no gradient
    flows through the selection. A micro-batch without real tokens selects none.
    """
    real = mask > 0
    h = jax.lax.stop_gradient(entropy).astype(jnp.float32)
    flat = jnp.sort(jnp.where(real, h, jnp.inf).reshape(-1))  # the real tokens first, ascending
    count = jnp.sum(real).astype(jnp.float32)
    pos = (1.0 - fraction) * jnp.maximum(count - 1.0, 0.0)
    low = jnp.floor(pos)
    last = flat.shape[0] - 1
    below = flat[jnp.clip(low.astype(jnp.int32), 0, last)]
    above = flat[jnp.clip(jnp.ceil(pos).astype(jnp.int32), 0, last)]
    # `above == below` whenever pos is whole: no inf - inf at the end of the real tokens
    threshold = jnp.where(above > below, below + (pos - low) * (above - below), below)
    return real & (h >= threshold)


def policy_objective(model: Policy, example: TrainExample, *, temperature: float, chunk_tokens: int,
                     router_aux_coef: float = 0.0, **settings) -> LossOutput:
    """`policy_gradient_loss` of the example under `model`: its log-probs and entropy at
    `temperature` (the sampler's), unembedded `chunk_tokens` at a time, replaying the example's
    recorded routing when it carries one (algorithm.routing_replay); `settings` are
    policy_gradient_loss's. `router_aux_coef` != 0 adds a mixture of experts' load-balancing loss
    (`router_aux_term`)."""
    logp, entropy, routed = routed_completion_logprobs(
        model, example.prompt_tokens, example.prompt_mask, example.completion_tokens, example.routing,
        temperature=temperature, chunk_tokens=chunk_tokens, packed=example.packed,
        shared=example.shared_prompts,
    )
    out = policy_gradient_loss(logp, entropy, example, **settings)
    return router_aux_term(out, routed, example.completion_mask, router_aux_coef) if router_aux_coef else out


def router_aux_term(out: LossOutput, routed: Any, mask: jax.Array, coef: float) -> LossOutput:
    """`out` plus coef * the router's load-balancing loss (rl_core.math.routing) of the micro-batch,
    over the positions that predict its real completion tokens (`mask` [B, T]), every layer pooled:
    the term is scaled by the micro-batch's denominator, so the step's loss (total / denominator)
    gains coef times the micro-batches' denominator-weighted mean. Logged as train/router_aux_loss
    (the mean over micro-batches)."""
    if routed is None:
        raise ValueError(f"router_aux_loss_coef = {coef}: the policy reports no routing (a dense model, "
                         "or training.packing on); set algorithm.router_aux_loss_coef=0")
    aux = load_balancing_loss(routed.probs, routed.experts, mask)
    means = {**out.means, "train/router_aux_loss": (aux, jnp.ones((), jnp.float32))}
    return out._replace(total=out.total + coef * aux * out.denom, means=means)


def policy_gradient_loss(
    logp: jax.Array,  # [B, T] current policy
    entropy: jax.Array,  # [B, T]
    example: TrainExample,
    *,
    policy_loss: Callable,
    aggregate: Callable,
    kl_estimator: Callable | None,
    beta: float,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
    max_len: int,
    tis_cap: float | None = None,
    entropy_top_fraction: float = 1.0,
    rollout_correction: RolloutCorrection | None = None,
    proximal: bool = False,
    distill_coef: float = 0.0,
) -> LossOutput:
    """The policy loss, corrected for the sampler (`rollout_correction`), plus beta * KL,
    aggregated into (sum, denominator).

    `rollout_correction` (rl_core.train.correction.correct_policy_terms, every mode of
    rl_core.math.rollout_correction) weighs each token's policy-gradient term by its weight and
    drops the tokens outside its keep-mask; the rejection modes also drop them from the
    aggregation's denominator and the KL term, as verl. `tis_cap` = C is the older spelling of
    token_tis with that cap (one of the two, or both agreeing). `proximal` (async rollouts):
    old_logp is the proximal policy's, so its gap to the sampler is logged as rollout/offpolicy_*,
    not rollout/mismatch_*.

    A per-sequence policy loss [B] and its diagnostics are spread over their tokens
    (rl_core.math.aggregation.per_token) before weighting and aggregation.

    `entropy_top_fraction` < 1 keeps the policy-gradient term only on the micro-batch's
    high-entropy tokens (`high_entropy_mask`) and zeroes it elsewhere, as TRL does: the KL term
    stays on every token, and the aggregation's denominator still counts every real token (TRL
    and the paper's objective, which normalise by all response tokens), so the selection drops
    terms without scaling the kept ones up. 1.0 (a static setting) leaves the loss untouched.

    `distill_coef` != 0 (on-policy distillation) gives each token the advantage
    A + distill_coef * (teacher_logp - old_logp) (rl_core.math.distillation.distill_advantages)
    before the policy loss sees it, and logs the sampled reverse KL to the teacher as
    train/distill_reverse_kl. A per-sequence policy loss (GSPO's "gspo") takes one advantage per
    completion and refuses these; its per-token form ("gspo_token") takes them.
    """
    mask = example.completion_mask
    # No behaviour log-probs only on a provably on-policy step: rho == 1 exactly in value.
    old_logp = example.old_logp if example.old_logp is not None else jax.lax.stop_gradient(logp)
    adv = example.advantages
    if distill_coef:
        if example.teacher_logp is None:
            raise ValueError(f"distill_coef = {distill_coef}: the example has no teacher log-probs (teacher_logp)")
        adv = distill_advantages(adv, old_logp, example.teacher_logp, mask, coef=distill_coef)
    pg, aux = policy_loss(logp, old_logp, adv, mask, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)
    pg = per_token(pg, mask)
    aux = aux._replace(**{k: per_token(v, mask) for k, v in aux._asdict().items()})
    if tis_cap is not None:
        alias = RolloutCorrection.token_tis(tis_cap)
        if rollout_correction is not None and rollout_correction.on and rollout_correction != alias:
            raise ValueError(f"tis_cap = {tis_cap} and rollout_correction = {rollout_correction}: set one of them")
        rollout_correction = alias
    if tis_cap is not None and example.sampler_logp is None:
        raise ValueError("truncated importance sampling (tis_cap) needs the sampler's log-probs (sampler_logp)")
    # sampler/trainer mismatch: each token's policy-gradient term weighed (and kept) by the correction
    pg, loss_mask, corr_means, corr_maxima = correct_policy_terms(
        pg, logp, old_logp, example.sampler_logp, mask, correction=rollout_correction, proximal=proximal)
    if entropy_top_fraction < 1.0:
        kept = high_entropy_mask(entropy, mask, entropy_top_fraction)
        pg = jnp.where(kept, pg, 0.0)
    per_token_loss = pg
    means = {
        "train/policy_loss": aggregate(pg, loss_mask, max_len=max_len),
        "train/entropy": masked_sum(entropy, mask),
        "train/clip_frac_low": masked_sum(aux.clipped_low, mask),
        "train/clip_frac_high": masked_sum(aux.clipped_high, mask),
        "train/ratio_mean": masked_sum(aux.ratio, mask),
    }
    if beta:
        kl = kl_estimator(logp, example.ref_logp)
        per_token_loss = per_token_loss + beta * kl
        means["train/kl"] = masked_sum(kl, mask)
    means.update(corr_means)  # drift/*, rollout/mismatch_*, rollout/staleness_*, rollout/*_frac
    if distill_coef:
        means["train/distill_reverse_kl"] = masked_sum(sampled_reverse_kl(old_logp, example.teacher_logp), mask)
    if entropy_top_fraction < 1.0:
        means["train/entropy_kept_frac"] = masked_sum(kept.astype(jnp.float32), mask)
    total, denom = aggregate(per_token_loss, loss_mask, max_len=max_len)
    real = mask > 0
    maxima = {"train/ratio_max": jnp.max(jnp.where(real, aux.ratio, -jnp.inf))}
    minima = {"train/ratio_min": jnp.min(jnp.where(real, aux.ratio, jnp.inf))}
    maxima.update(corr_maxima)
    return LossOutput(total, denom, means=means, maxima=maxima, minima=minima)
