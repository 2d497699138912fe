"""`trainer explain`: score one group by hand under every installed algorithm.

For a group of G completions with rewards r, importance ratios rho (one per
completion, the same for each of its tokens), lengths in tokens and a
per-token KL estimate, each algorithm's own registered functions give:

- advantages from its `advantage_estimator` (A = 0 everywhere for a tied group);
- the clipped-surrogate loss per token, -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A),
  from its `policy_loss` at logp = log(rho), old_logp = 0, and which bound is active
  (GSPO's sequence ratio is rho itself, as every token of a completion shares it; a loss
  of another form, CISPO's -w A log pi, is evaluated at the same point, log pi = log rho);
- the KL term beta * KL per token (only when beta > 0);
- the group's loss aggregated by its `loss_agg_mode`, every token of a
  completion carrying that completion's per-token loss, L_max = max(lengths).

Nothing here re-implements the math: it calls what the registry returns.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from rl_core import per_token, registry

# Fields an algorithm config needs for a group-relative explanation (GRPO and its variants).
_NEEDED_FIELDS = ("advantage_estimator", "policy_loss", "loss_agg_mode", "epsilon_low", "epsilon_high", "beta")
DEFAULT_LENGTH = 4
"""Tokens per completion when --lengths is not given."""


class ExplainInputError(ValueError):
    """A bad --rewards / --ratios / --lengths / --kl value; the message names the argument."""


@dataclasses.dataclass(frozen=True)
class Group:
    """One group, validated: G rewards, G ratios > 0, G lengths >= 1, a finite per-token KL."""

    rewards: tuple[float, ...]
    ratios: tuple[float, ...]
    lengths: tuple[int, ...]
    kl: float

    @property
    def size(self) -> int:
        return len(self.rewards)

    @property
    def uniform(self) -> bool:
        return max(self.rewards) == min(self.rewards)


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What one algorithm makes of the group (per-completion values are per token)."""

    algo: str
    advantage_estimator: str
    loss_agg_mode: str
    eps_low: float
    eps_high: float
    dual_clip: float | None
    beta: float
    kl_estimator: str
    advantages: tuple[float, ...]
    surrogate: tuple[float, ...]
    """Clipped-surrogate loss per token of each completion."""
    clip: tuple[str, ...]
    """Active bound per completion: 'low', 'high', 'dual' or 'none'."""
    kl_term: float
    """beta * KL per token (0 when beta = 0)."""
    policy_loss: float
    """The surrogate alone, aggregated."""
    kl_loss: float
    """The KL term alone, aggregated."""
    loss: float
    """The group's aggregated loss: policy_loss + kl_loss."""
    uniform: bool
    note: str


def _numbers(name: str, text: str | Sequence[float]) -> list[float]:
    if isinstance(text, str):
        parts = [p.strip() for p in text.split(",")]
        if not text.strip() or any(not p for p in parts):
            raise ExplainInputError(f"--{name} {text!r}: expected comma-separated numbers, e.g. 1,0,0,1")
        values = []
        for p in parts:
            try:
                values.append(float(p))
            except ValueError:
                raise ExplainInputError(f"--{name}: {p!r} is not a number (in {text!r})") from None
    else:
        values = [float(v) for v in text]
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise ExplainInputError(f"--{name}: {bad[0]} is not a finite number")
    return values


def parse_group(
    rewards: str | Sequence[float],
    ratios: str | Sequence[float] | None = None,
    lengths: str | Sequence[float] | None = None,
    kl: float = 0.0,
) -> Group:
    """Validate the command-line values into a `Group`; errors name the argument."""
    r = _numbers("rewards", rewards)
    if len(r) < 2:
        raise ExplainInputError(f"--rewards: a group needs at least 2 completions to compare, got {len(r)}")
    g = len(r)
    rho = _numbers("ratios", ratios) if ratios is not None else [1.0] * g
    if len(rho) != g:
        raise ExplainInputError(f"--ratios: got {len(rho)} values for {g} rewards; give one ratio per completion")
    if any(x <= 0 for x in rho):
        raise ExplainInputError(f"--ratios: importance ratios must be > 0, got {min(rho)}")
    raw = _numbers("lengths", lengths) if lengths is not None else [DEFAULT_LENGTH] * g
    if len(raw) != g:
        raise ExplainInputError(f"--lengths: got {len(raw)} values for {g} rewards; give one length per completion")
    if any(x != int(x) or x < 1 for x in raw):
        raise ExplainInputError(f"--lengths: lengths are token counts, whole numbers >= 1, got {raw}")
    if not math.isfinite(float(kl)):
        raise ExplainInputError(f"--kl: {kl} is not a finite number")
    return Group(tuple(r), tuple(rho), tuple(int(x) for x in raw), float(kl))


def explain_algorithm(name: str, group: Group) -> Explanation | str:
    """The explanation under algorithm `name` (its config defaults), or why it cannot be given."""
    algorithm = registry.get_algorithm(name)
    config = algorithm.config()
    fields = {f.name for f in dataclasses.fields(config)}
    missing = [f for f in _NEEDED_FIELDS if f not in fields]
    if missing:
        return f"{name}: not a group-relative algorithm (its config has no {', '.join(missing)}); skipped"
    if getattr(config, "estimator_category", "advantage_estimator") != "advantage_estimator":
        return (f"{name}: its advantages come from a critic's values ({config.advantage_estimator}), not from the "
                "group's rewards alone; skipped")
    g = group.size
    estimator = registry.get("advantage_estimator", config.advantage_estimator)
    policy_loss = registry.get("policy_loss", config.policy_loss)
    aggregate = registry.get("loss_aggregation", config.loss_agg_mode)
    dual_clip = config.dual_clip if "dual_clip" in fields else None

    adv = estimator(jnp.asarray(group.rewards, jnp.float32), g)
    logp = jnp.log(jnp.asarray(group.ratios, jnp.float32))[:, None]  # [G, 1]: one token stands for all
    loss, aux = policy_loss(
        logp, jnp.zeros_like(logp), adv, jnp.ones_like(logp),
        eps_low=config.epsilon_low, eps_high=config.epsilon_high, dual_clip=dual_clip,
    )
    # a sequence-level loss (GSPO) returns [G]: one completion is one "token" here anyway
    loss = per_token(loss, logp)
    aux = aux._replace(**{k: per_token(v, logp) for k, v in aux._asdict().items()})
    clip = []
    for low, high, dual in zip(aux.clipped_low[:, 0], aux.clipped_high[:, 0], aux.dual_clipped[:, 0], strict=True):
        clip.append("dual" if dual else "low" if low else "high" if high else "none")

    max_len = max(group.lengths)
    mask = (np.arange(max_len)[None, :] < np.asarray(group.lengths)[:, None]).astype(np.float32)  # [G, L_max]
    kl_term = config.beta * group.kl if config.beta > 0 else 0.0

    def aggregated(per_token: jnp.ndarray) -> float:
        total, denom = aggregate(jnp.broadcast_to(per_token, mask.shape), jnp.asarray(mask), max_len=max_len)
        return float(total / denom)

    pg = aggregated(loss)
    kl_loss = aggregated(jnp.full((g, 1), kl_term, jnp.float32)) if config.beta > 0 else 0.0
    return Explanation(
        algo=name,
        advantage_estimator=config.advantage_estimator,
        loss_agg_mode=config.loss_agg_mode,
        eps_low=config.epsilon_low,
        eps_high=config.epsilon_high,
        dual_clip=dual_clip,
        beta=config.beta,
        kl_estimator=config.kl_estimator if "kl_estimator" in fields else "",
        advantages=tuple(_clean(x) for x in np.asarray(adv)),
        surrogate=tuple(_clean(x) for x in np.asarray(loss[:, 0])),
        clip=tuple(clip),
        kl_term=kl_term,
        policy_loss=_clean(pg),
        kl_loss=_clean(kl_loss),
        loss=_clean(pg + kl_loss),
        uniform=group.uniform,
        note=_note(config, fields, group, kl_term),
    )


def _clean(x: float) -> float:
    """A Python float with -0.0 shown as 0.0."""
    x = float(x)
    return 0.0 if x == 0 else x


def _note(config, fields: set[str], group: Group, kl_term: float) -> str:
    distill = getattr(config, "distill_coef", 0)
    tied = _tied_note(config, fields, group, kl_term)
    if not distill:
        return tied
    # on-policy distillation (docs/distillation.md): a per-token term these rewards do not show
    text = (f"distillation: each token's advantage also gains distill_coef * (log pi_teacher - log pi_old) = "
            f"{distill:g} * (...), from a teacher's log-probs of the tokens (not shown)")
    if group.uniform:  # the rewards' advantages are 0, the teacher's term is not
        tied = "tied group: every advantage from the rewards is exactly 0"
    return f"{tied}; {text}" if tied else text


def _tied_note(config, fields: set[str], group: Group, kl_term: float) -> str:
    if not group.uniform:
        return ""
    if config.beta > 0:
        text = (
            f"tied group: every advantage is exactly 0, so the surrogate is 0 and only the KL term remains "
            f"(beta * KL = {config.beta:g} * {group.kl:g} = {kl_term:g} per token)"
        )
    else:
        text = "tied group: every advantage is exactly 0 and beta = 0, so this group contributes nothing (zero gradient)"
    if "dynamic_sampling" in fields and config.dynamic_sampling:
        text += "; dynamic sampling drops it and samples another prompt instead"
    return text


def _fmt(x: float) -> str:
    return "0" if x == 0 else f"{x:+.4f}"


def _plain(x: float) -> str:
    return "0" if x == 0 else f"{x:.4f}"


def _num(x: float) -> str:
    return f"{x:g}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    line = lambda cells: indent + "  ".join(str(c).rjust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return [line(header), *(line(r) for r in rows)]


def render(group: Group, explanations: Sequence[Explanation | str]) -> str:
    """Plain aligned text: one block per algorithm."""
    lines = [
        f"group of {group.size}: rewards {', '.join(map(_num, group.rewards))}; "
        f"ratios {', '.join(map(_num, group.ratios))}; lengths {', '.join(map(str, group.lengths))} tokens; "
        f"KL estimate {_num(group.kl)} per token",
        "uniform (tied) group: all rewards equal" if group.uniform else "mixed group: rewards differ",
    ]
    for e in explanations:
        lines.append("")
        if isinstance(e, str):
            lines.append(e)
            continue
        clip = f"clip [{1 - e.eps_low:g}, {1 + e.eps_high:g}]" + (f", dual clip {e.dual_clip:g}" if e.dual_clip else "")
        kl = f"beta {e.beta:g} ({e.kl_estimator})" if e.beta > 0 else "beta 0 (no KL term)"
        lines.append(
            f"{e.algo}: advantages {e.advantage_estimator}, {clip}, {kl}, "
            f"aggregation {e.loss_agg_mode} (L_max {max(group.lengths)})"
        )
        header = ["i", "reward", "ratio", "len", "advantage", "surrogate/token", "clip"]
        if e.beta > 0:
            header.append("KL term/token")
        rows = []
        for i in range(group.size):
            row = [
                str(i + 1),
                _num(group.rewards[i]),
                _num(group.ratios[i]),
                str(group.lengths[i]),
                _fmt(e.advantages[i]),
                _fmt(e.surrogate[i]),
                e.clip[i],
            ]
            if e.beta > 0:
                row.append(_fmt(e.kl_term))
            rows.append(row)
        lines += _table(header, rows)
        if e.beta > 0:
            lines.append(f"  loss = {_plain(e.policy_loss)} (surrogate) + {_plain(e.kl_loss)} (KL) = {_plain(e.loss)}")
        else:
            lines.append(f"  loss = {_plain(e.loss)}")
        if e.note:
            lines.append(f"  {e.note}")
    return "\n".join(lines)


def explain(
    *,
    rewards: str | Sequence[float],
    ratios: str | Sequence[float] | None = None,
    lengths: str | Sequence[float] | None = None,
    kl: float = 0.0,
    algos: Sequence[str] | None = None,
) -> str:
    """The report for every installed algorithm (or `algos`)."""
    group = parse_group(rewards, ratios, lengths, kl)
    names = list(algos) if algos else registry.registry.names("algorithm")
    return render(group, [explain_algorithm(n, group) for n in names])
