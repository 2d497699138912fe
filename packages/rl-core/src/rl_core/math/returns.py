"""Per-token rewards, generalized advantage estimation and the returns a critic learns.

Shapes: B completions, T completion tokens; `mask` [B, T] is 1.0 on the tokens of
the loss. Rows are right-padded; a masked position inside a row (e.g. a future
episode's observation tokens) is skipped: it takes no reward, and the recursion
carries the next real token's value and advantage across it, as verl and Tunix do.

- `token_rewards`: the sequence reward R at the last real token, minus beta * KL_t
  on every real token when a reference policy is used (verl's and Tunix's
  token-level rewards): r_t = R [t = last] - beta * kl_t.
- `gae` (Schulman et al. 2015, arXiv:1506.02438): with V_t the critic's value
  before token t and V = 0 after the last real token,
      delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lambda A_{t+1},
  and the critic's target (the lambda-return) G_t = A_t + V_t. lambda = 1 gives
  the discounted reward-to-go minus V_t; lambda = 0 the one-step TD error.
- `whiten`: (x - mean) / std over the real tokens of the batch.
- "gae", the registered `token_advantage_estimator`: whitened GAE advantages and
  the unwhitened returns (verl's and Tunix's PPO).
- `explained_variance`: 1 - Var(G - V) / Var(G) over real tokens, the critic's fit.

Every function is pure, jit- and vmap-compatible, and keeps masked positions at 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl_core import registry
from rl_core.registry import register

WHITEN_EPS = 1e-8
"""Added to the variance before the square root (verl and Tunix): all-equal advantages become 0, not 0/0."""


def _real(mask: jax.Array) -> jax.Array:
    return jnp.asarray(mask) > 0


def token_rewards(rewards: jax.Array, mask: jax.Array, *, kl: jax.Array | None = None, beta: float = 0.0) -> jax.Array:
    """r [B, T]: each row's reward [B] at its last real token, minus beta * kl [B, T] on its
    real tokens; 0 at masked positions. A row without a real token gets no reward."""
    real = _real(mask)
    positions = jnp.arange(real.shape[-1])
    last = jnp.max(jnp.where(real, positions, -1), axis=-1, keepdims=True)
    rewards = jnp.asarray(rewards, jnp.float32)
    placed = jnp.where(real & (positions == last), rewards[..., None], 0.0)
    if kl is not None and beta:
        placed = placed - beta * jnp.where(real, kl, 0.0)
    return placed


def gae(rewards: jax.Array, values: jax.Array, mask: jax.Array, *, gamma: float, lam: float
        ) -> tuple[jax.Array, jax.Array]:
    """(advantages, returns) [B, T] from token rewards, values and mask [B, T] (module docstring)."""
    real = _real(mask)
    rewards = jnp.where(real, rewards, 0.0).astype(jnp.float32)
    values = jnp.where(real, values, 0.0).astype(jnp.float32)

    def step(carry, xs):
        next_value, next_adv = carry  # of the next real token (0 after the last)
        r, v, m = xs
        adv = r + gamma * next_value - v + gamma * lam * next_adv
        # a masked position passes the next real token's value and advantage on unchanged
        carry = (jnp.where(m, v, next_value), jnp.where(m, adv, next_adv))
        return carry, jnp.where(m, adv, 0.0)

    zeros = jnp.zeros(rewards.shape[:-1], jnp.float32)
    columns = lambda x: jnp.moveaxis(x, -1, 0)  # noqa: E731 - scan over T, from the end
    _, adv = jax.lax.scan(step, (zeros, zeros), (columns(rewards), columns(values), columns(real)), reverse=True)
    adv = jnp.moveaxis(adv, 0, -1)
    return adv, jnp.where(real, adv + values, 0.0)


def whiten(x: jax.Array, mask: jax.Array) -> jax.Array:
    """(x - mean) / sqrt(var + 1e-8) over the real tokens (variance with Bessel's correction,
    as verl and Tunix); 0 at masked positions."""
    real = _real(mask)
    n = jnp.sum(real)
    mean = jnp.sum(jnp.where(real, x, 0.0)) / jnp.maximum(n, 1)
    var = jnp.sum(jnp.where(real, jnp.square(x - mean), 0.0)) / jnp.maximum(n - 1, 1)
    return jnp.where(real, (x - mean) * jax.lax.rsqrt(var + WHITEN_EPS), 0.0)


@register("token_advantage_estimator", "gae")
def gae_advantages(rewards: jax.Array, values: jax.Array, mask: jax.Array, *, gamma: float, lam: float
                   ) -> tuple[jax.Array, jax.Array]:
    """GAE advantages whitened over the batch's real tokens, and the (unwhitened) returns."""
    adv, returns = gae(rewards, values, mask, gamma=gamma, lam=lam)
    return whiten(adv, mask), returns


registry.registry.note_foreign_name(
    "advantage_estimator", "gae",
    "'gae' is a token_advantage_estimator: it needs a critic's values (PPO, algorithm 'ppo'), not a group.",
)


def explained_variance(values: jax.Array, returns: jax.Array, mask: jax.Array) -> jax.Array:
    """1 - Var(returns - values) / Var(returns) over the real tokens: 1 for a perfect critic,
    0 for one that predicts the mean return, below 0 for a worse one (verl's vf_explained_var)."""
    real = _real(mask)
    n = jnp.maximum(jnp.sum(real), 1)

    def var(x):
        mean = jnp.sum(jnp.where(real, x, 0.0)) / n
        return jnp.sum(jnp.where(real, jnp.square(x - mean), 0.0)) / n

    return 1.0 - var(returns - values) / (var(returns) + WHITEN_EPS)
