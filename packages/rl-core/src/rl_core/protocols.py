"""What a function of each registry category must accept and return.

One `typing.Protocol` per category documents the call the learner makes;
`check_signature` is run by the registry when a function is registered (by
the `@register` decorator at import, or from an algorithm's entry point), so
a function that cannot take that call fails with its name and the expected
signature before anything trains, not inside the first jitted step.

Only the call is checked (argument names and kinds, defaults of anything
extra); return values are documented here and checked by the tests.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:  # annotations only: importing the registry must not start jax
    import jax


class PolicyLossAux(NamedTuple):
    """Diagnostics with the loss's shape ([B, T] per token or [B] per sequence), unreduced."""

    ratio: jax.Array
    """rho_t = exp(logp_t - old_logp_t), bounded; 1 at masked positions."""
    clipped_low: jax.Array
    """1.0 where the lower bound is active; for the clipped surrogate: A < 0 and rho < 1 - eps_low."""
    clipped_high: jax.Array
    """1.0 where the upper bound is active; for the clipped surrogate: A > 0 and rho > 1 + eps_high."""
    dual_clipped: jax.Array
    """1.0 where A < 0 and the dual-clip bound c*A is active; zeros without dual clip."""


class AdvantageEstimator(Protocol):
    """rewards float [B] (whole groups, group-contiguous: the step's whole batch) -> advantages float [B].

    `group_size` is a Python int, static under `jax.jit`. The estimator sees
    every row of the step, so it may normalise within groups, over the whole
    batch, or both; it runs once per step before the batch is split into
    mini- and micro-batches, so batch statistics are exact. A group whose
    rewards are all equal must get advantages of exactly 0.

    An estimator with the attribute `takes_reward_scores = True` (GDPO) is also passed
    `scores` [K, B] (each reward function's unweighted scores) and `weights` [K] by keyword
    (rl_core.math.advantages.takes_reward_scores).
    """

    def __call__(self, rewards: jax.Array, group_size: int) -> jax.Array: ...


class TokenAdvantageEstimator(Protocol):
    """(rewards, values, mask [B, T]) -> (advantages [B, T], returns [B, T]), for a learner with a critic.

    `rewards` are per token (rl_core.math.returns.token_rewards: the sequence reward at the
    last real token, minus beta * KL), `values` the critic's values before each token
    at collection time, `mask` 1.0 on the tokens of the loss; `returns` are the critic's
    targets. Group estimators (`AdvantageEstimator`) keep their own call: they need no
    critic, and these need no groups. Like them, it sees the step's whole batch.
    """

    def __call__(
        self, rewards: jax.Array, values: jax.Array, mask: jax.Array, *, gamma: float, lam: float
    ) -> tuple[jax.Array, jax.Array]: ...


class PolicyLoss(Protocol):
    """(logp, old_logp [B, T], adv [B], mask [B, T]) -> (loss, PolicyLossAux), unreduced.

    `loss` is per token [B, T] or per sequence [B]; the aux fields have the
    same shape as `loss`. A per-sequence term stands for the same value on
    every real token of its sequence (see rl_core.math.aggregation), and a
    sequence-level loss derives lengths from the mask: |y_i| = sum_t mask[i, t].
    """

    def __call__(
        self,
        logp: jax.Array,
        old_logp: jax.Array,
        adv: jax.Array,
        mask: jax.Array,
        *,
        eps_low: float,
        eps_high: float,
        dual_clip: float | None,
    ) -> tuple[jax.Array, PolicyLossAux]: ...


class LossAggregation(Protocol):
    """(x [B, T] or [B], mask [B, T], max_len) -> (total, denominator), float32 scalars."""

    def __call__(self, x: jax.Array, mask: jax.Array, *, max_len: int) -> tuple[jax.Array, jax.Array]: ...


class KLEstimator(Protocol):
    """(logp [B, T], ref_logp [B, T]) -> per-token KL estimate [B, T], unreduced."""

    def __call__(self, logp: jax.Array, ref_logp: jax.Array) -> jax.Array: ...


PROTOCOLS: Mapping[str, type] = {
    "advantage_estimator": AdvantageEstimator,
    "token_advantage_estimator": TokenAdvantageEstimator,
    "policy_loss": PolicyLoss,
    "loss_aggregation": LossAggregation,
    "kl_estimator": KLEstimator,
}


class SignatureError(TypeError):
    """A function registered in a category whose call it cannot take."""


def expected_call(category: str) -> str:
    """The category's call as text, e.g. "(rewards, group_size)"."""
    params = list(inspect.signature(PROTOCOLS[category].__call__).parameters.values())[1:]
    return "(" + ", ".join(_param_text(p, params, i) for i, p in enumerate(params)) + ")"


def _param_text(p: inspect.Parameter, params: list[inspect.Parameter], i: int) -> str:
    first_kw = p.kind is inspect.Parameter.KEYWORD_ONLY and (i == 0 or params[i - 1].kind is not p.kind)
    return ("*, " if first_kw else "") + p.name


def check_signature(category: str, name: str, fn: Callable[..., Any]) -> None:
    """Raise `SignatureError` unless `fn` accepts the call the learner makes for `category`.

    The protocol's positional arguments are passed by position and its
    keyword-only ones by name; any further parameter of `fn` needs a default.
    """
    if category not in PROTOCOLS:
        return
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        raise SignatureError(f"{category} {name!r} ({where}) is not a callable with an inspectable signature") from None
    params = list(inspect.signature(PROTOCOLS[category].__call__).parameters.values())[1:]
    positional = [object()] * sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
    keywords = {p.name: object() for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    try:
        signature.bind(*positional, **keywords)
    except TypeError as e:
        raise SignatureError(
            f"{category} {name!r} ({where}) has the signature {signature}, which cannot take the call "
            f"fn{expected_call(category)} ({e}); see rl_core.protocols.{PROTOCOLS[category].__name__}"
        ) from None
