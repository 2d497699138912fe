"""Group-relative advantage estimators: rewards [B] -> advantages [B].

Rewards are laid out group-contiguous: B = num_groups * G and rows
g*G .. g*G+G-1 are the G completions of one prompt. Every estimator is pure,
jit- and vmap-compatible, and takes `group_size` as a Python int (it fixes a
reshape, so it must be static under jit).

- "grpo": A_i = (r_i - mean(r)) / (std(r, ddof=1) + 1e-6)   (arXiv:2402.03300)
- "rloo": A_i = r_i - mean_{j != i} r_j                      (arXiv:2402.14740)
- "gdpo": every reward function's scores GRPO-normalised within the group, summed by
          weight, then normalised over the batch                (arXiv:2601.05242)
- "zero": A_i = 0: no reward signal (on-policy distillation alone, where the teacher's
          per-token term, rl_core.math.distillation, is the whole signal)

A group whose rewards are all equal gets advantages of exactly 0.0 from every
estimator here: such a group carries no learning signal, and the learner and
DAPO count it (`uniform_groups`). For "gdpo", which reads each reward function's
scores, that holds for a group in which every function's scores are all equal.

An estimator marked by `takes_reward_scores` (GDPO) is also passed, by keyword,
`scores` float [K, B] (each reward function's unweighted scores, in the reward
manager's order) and `weights` float [K] (their weights in the total).
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp

from rl_core.registry import register

GRPO_STD_EPS = 1e-6
"""Added to the group's standard deviation so a tied group gives 0, not 0/0 (TRL and Tunix use 1e-6 too)."""


def _check_groups(rewards: jax.Array, group_size: int) -> None:
    """Trace-time shape checks: a bad layout must fail loudly, not reshape silently."""
    try:
        group_size = operator.index(group_size)
    except TypeError:
        raise TypeError(
            f"group_size must be a Python int (it is static under jit), got {group_size!r} "
            f"of type {type(group_size).__name__}"
        ) from None
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 to compare completions within a group, got {group_size}")
    if jnp.ndim(rewards) != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {jnp.shape(rewards)}")
    num = jnp.shape(rewards)[0]
    if num % group_size != 0:
        raise ValueError(
            f"rewards.shape[0] = {num} is not a multiple of group_size = {group_size}; "
            "rewards must hold whole groups laid out contiguously"
        )


def _grouped(rewards: jax.Array, group_size: int) -> jax.Array:
    """[B] -> float [B // G, G], after validating the layout."""
    _check_groups(rewards, group_size)
    rewards = jnp.asarray(rewards)
    # Integer or half-precision rewards are promoted so means are not truncated.
    rewards = rewards.astype(jnp.promote_types(rewards.dtype, jnp.float32))
    return rewards.reshape(-1, group_size)


def _uniform(groups: jax.Array) -> jax.Array:
    """bool [num_groups, 1]: every reward in the group is identical."""
    return jnp.max(groups, axis=1, keepdims=True) == jnp.min(groups, axis=1, keepdims=True)


def uniform_groups(rewards: jax.Array, group_size: int) -> jax.Array:
    """bool [B // G]: True for groups whose rewards are all equal (max == min).

    Used for the `groups/uniform_frac` metric and by DAPO's dynamic sampling,
    which drops such groups (their std is 0).
    """
    return _uniform(_grouped(rewards, group_size))[:, 0]


def group_centered(rewards: jax.Array, group_size: int) -> jax.Array:
    """r_i - mean(r) within each group, exactly 0 for uniform groups; float [B].

    The shared numerator of GRPO and Dr. GRPO (which stops here).
    """
    groups = _grouped(rewards, group_size)
    centered = groups - jnp.mean(groups, axis=1, keepdims=True)
    # A float mean can differ from r_i by one rounding step (e.g. [0.1]*3), which
    # divided by 1e-6 is not negligible; uniform groups are forced to exactly 0.
    return jnp.where(_uniform(groups), jnp.zeros_like(centered), centered).reshape(-1)


@register("advantage_estimator", "grpo")
def grpo_advantages(rewards: jax.Array, group_size: int) -> jax.Array:
    """GRPO: A_i = (r_i - mean(r)) / (std(r, ddof=1) + 1e-6) within each group.

    rewards: float [B] (group-contiguous); returns float [B].
    """
    std = jnp.std(_grouped(rewards, group_size), axis=1, ddof=1)
    return group_centered(rewards, group_size) / (jnp.repeat(std, group_size) + GRPO_STD_EPS)


@register("advantage_estimator", "rloo")
def rloo_advantages(rewards: jax.Array, group_size: int) -> jax.Array:
    """RLOO: A_i = r_i - mean_{j != i} r_j, the leave-one-out baseline.

    rewards: float [B] (group-contiguous); returns float [B].
    """
    groups = _grouped(rewards, group_size)
    total = jnp.sum(groups, axis=1, keepdims=True)
    # The baseline for i excludes i itself, so it is unbiased for r_i.
    adv = groups - (total - groups) / (group_size - 1)
    adv = jnp.where(_uniform(groups), jnp.zeros_like(adv), adv)
    return adv.reshape(-1)


@register("advantage_estimator", "zero")
def zero_advantages(rewards: jax.Array, group_size: int) -> jax.Array:
    """A_i = 0 for every completion: the rewards train nothing (they are still scored and logged).

    rewards: float [B] (group-contiguous); returns float [B].
    """
    _check_groups(rewards, group_size)
    return jnp.zeros_like(rewards)


REWARD_SCORES_ATTR = "takes_reward_scores"
"""Set to True on an estimator that reads each reward function's scores, not only their total."""


def takes_reward_scores(estimator: object) -> bool:
    """True when the pipeline must pass `estimator` the per-function `scores` and `weights`."""
    return bool(getattr(estimator, REWARD_SCORES_ATTR, False))


@register("advantage_estimator", "gdpo")
def gdpo_advantages(
    rewards: jax.Array,
    group_size: int,
    scores: jax.Array | None = None,
    weights: jax.Array | None = None,
    *,
    batch_normalize: bool = True,
) -> jax.Array:
    """GDPO, Group reward-Decoupled normalization Policy Optimization (arXiv:2601.05242, code at
    github.com/NVlabs/GDPO; verl registers it as the advantage estimator `gdpo`).

    For each reward function k (scores r_k, weight w_k), within each group:
        A_k   = (r_k - mean(r_k)) / (std(r_k, ddof=1) + 1e-6)     = grpo_advantages(r_k)
        A_sum = sum_k w_k * A_k
        A     = (A_sum - mean_B(A_sum)) / (std_B(A_sum, ddof=1) + 1e-6)   over the step's B rows
    GRPO instead normalises the weighted total sum_k w_k r_k, so distinct combinations of
    scores that give the same total collapse to one advantage (the paper's "reward advantage
    collapse"); normalising each function first keeps them apart.

    The last step, the batch normalisation, is the paper's and its reference code's: over
    sequences, as in the authors' TRL code (verl whitens over tokens instead, so a longer
    completion weighs more there). `batch_normalize=False` stops after A_sum; with one reward
    function of weight 1 that is exactly `grpo_advantages`. The 1e-6 of both steps is GRPO's
    here (the authors' TRL code uses 1e-4). Rows of a group in which every function's scores
    are all equal get exactly 0.

    rewards: float [B] (group-contiguous), the weighted total; it is the only reward when
    `scores` is None. scores: float [K, B], each function's unweighted scores; weights: float
    [K] (None: all 1). Returns float [B].
    """
    rewards = jnp.asarray(rewards)
    _check_groups(rewards, group_size)
    if scores is None:
        scores = rewards[None, :]
    scores = jnp.asarray(scores)
    if jnp.ndim(scores) != 2 or jnp.shape(scores)[0] < 1 or jnp.shape(scores)[1] != jnp.shape(rewards)[0]:
        raise ValueError(
            f"scores must be [K, B] with K >= 1 reward functions and B = rewards.shape[0] = "
            f"{jnp.shape(rewards)[0]}, got shape {jnp.shape(scores)}"
        )
    num = jnp.shape(scores)[0]
    weights = jnp.ones((num,), jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)
    if jnp.shape(weights) != (num,):
        raise ValueError(f"weights must be [K] = [{num}], one per reward function, got shape {jnp.shape(weights)}")
    combined = weights[0] * grpo_advantages(scores[0], group_size)
    uniform = _uniform(_grouped(scores[0], group_size))
    for k in range(1, num):
        combined = combined + weights[k] * grpo_advantages(scores[k], group_size)
        uniform = uniform & _uniform(_grouped(scores[k], group_size))
    if not batch_normalize:
        return combined
    normalized = (combined - jnp.mean(combined)) / (jnp.std(combined, ddof=1) + GRPO_STD_EPS)
    # The batch mean of A_sum is 0 up to rounding (every group's A_k sum to 0): a group with no
    # signal in any reward keeps exactly 0, not -mean / std.
    return jnp.where(jnp.repeat(uniform[:, 0], group_size), jnp.zeros_like(normalized), normalized)


setattr(gdpo_advantages, REWARD_SCORES_ATTR, True)
