"""The reward auditor: each step's audit metrics, their limits, and one warning line per kind.

``step_audit`` and ``trips`` are pure (a step's numbers in, metrics or trips out); the
``RewardAuditor`` holds what carries from step to step (each function's streak of
constant steps, which warnings were already given) and is what a learner calls once
per step. ``summarize`` reads a run's metric records back into its report. The
math of each audit is in ``rewards.audits``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rewards.audits import constant_in_groups, length_correlation, next_streak, reward_shares, unfinished_rewarded

__all__ = ["PREFIX", "AuditLimits", "RewardAuditor", "Trip", "step_audit", "summarize", "trips"]

PREFIX = "reward_audit/"
UNFINISHED, LENGTH_CORR, CONSTANT, SHARE = (f"{PREFIX}{k}" for k in
                                           ("unfinished_rewarded", "length_corr", "constant_groups_steps/", "share/"))
TRIPPED = f"{PREFIX}tripped"


@dataclass(frozen=True, kw_only=True)
class AuditLimits:
    """When an audit trips; each has a value that turns it off."""

    unfinished_rewarded_max: float = 0.25
    """Trip when more than this share of the rewarded completions did not finish (1.0: never)."""
    length_corr_max: float = 0.5
    """Trip when reward correlates with length (Pearson, over the step's batch) above this (1.0: never)."""
    constant_steps: int = 20
    """Trip when a function has been constant within every group for this many steps in a row (0: never)."""
    share_max: float = 0.5
    """Trip when a function other than the correctness one makes more than this share of the
    weighted total's magnitude (1.0: never)."""

    def __post_init__(self) -> None:
        for name in ("unfinished_rewarded_max", "length_corr_max", "share_max"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{type(self).__name__}.{name} = {value!r}: must be in [0, 1] (1 turns it off)")
        steps = self.constant_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"{type(self).__name__}.constant_steps = {steps!r}: must be an int >= 0 (0 turns it off)")


def step_audit(
    *,
    total: Sequence[float],
    per_function: Mapping[str, Sequence[float]],
    weights: Mapping[str, float],
    lengths: Sequence[float],
    finished: Sequence[bool],
    group_size: int,
    streaks: Mapping[str, int],
) -> tuple[dict[str, float], dict[str, int]]:
    """One step's audit metrics and each function's streak after it.

    Keys: ``reward_audit/unfinished_rewarded``, ``reward_audit/length_corr``,
    ``reward_audit/share/<fn>`` and, for groups of 2 or more, ``reward_audit/constant_groups_steps/<fn>``.
    """
    metrics = {UNFINISHED: unfinished_rewarded(total, finished), LENGTH_CORR: length_correlation(total, lengths)}
    metrics.update({f"{SHARE}{name}": share for name, share in reward_shares(per_function, weights).items()})
    new = dict(streaks)
    if group_size >= 2:  # a group of one is always "constant": there is nothing to compare
        for name, scores in per_function.items():
            new[name] = next_streak(streaks.get(name, 0), constant_in_groups(scores, group_size))
            metrics[f"{CONSTANT}{name}"] = float(new[name])
    return metrics, new


@dataclass(frozen=True)
class Trip:
    """One audit over its limit on one step."""

    kind: str
    """unfinished_rewarded, length_corr, constant_groups or share."""
    function: str | None
    """The reward function it concerns (constant_groups, share), else None."""
    value: float
    limit: float

    @property
    def key(self) -> str:
        return self.kind if self.function is None else f"{self.kind}/{self.function}"

    def message(self, step: int) -> str:
        """The warning line, with the numbers."""
        head = f"reward audit, step {step}:"
        if self.kind == "unfinished_rewarded":
            return (f"{head} {self.value:.0%} of the rewarded completions did not finish (hit max_new_tokens without "
                    f"EOS; limit {self.limit:.0%}): a reward may be paying truncated completions")
        if self.kind == "length_corr":
            return (f"{head} reward correlates with completion length (r = {self.value:.2f} > {self.limit:.2f}): "
                    "a reward may be paying length")
        if self.kind == "constant_groups":
            return (f"{head} reward {self.function!r} has been the same within every group for {self.value:.0f} steps "
                    f"(limit {self.limit:.0f}): it gives no advantage, so no learning signal")
        return (f"{head} reward {self.function!r} makes {self.value:.0%} of the weighted total (limit "
                f"{self.limit:.0%}), more than the correctness reward should leave it")


def trips(metrics: Mapping[str, float], limits: AuditLimits, *, correctness: str | None) -> list[Trip]:
    """The audits over their limits in one step's metrics (a live step's or a logged record)."""
    found = []
    value = metrics.get(UNFINISHED)
    if value is not None and value > limits.unfinished_rewarded_max:
        found.append(Trip("unfinished_rewarded", None, value, limits.unfinished_rewarded_max))
    value = metrics.get(LENGTH_CORR)
    if value is not None and value > limits.length_corr_max:
        found.append(Trip("length_corr", None, value, limits.length_corr_max))
    for key, value in metrics.items():
        if limits.constant_steps and key.startswith(CONSTANT) and value >= limits.constant_steps:
            found.append(Trip("constant_groups", key[len(CONSTANT):], value, limits.constant_steps))
        if key.startswith(SHARE) and key[len(SHARE):] != correctness and value > limits.share_max:
            found.append(Trip("share", key[len(SHARE):], value, limits.share_max))
    return found


class RewardAuditor:
    """Called once per step by the learner (rl_core.learner.reward_audit.RewardAudit): returns the
    step's ``reward_audit/*`` metrics and writes a warning line to ``log`` the first time each
    audit (per function) trips. ``state_json`` / ``restore_json``: the streaks and warnings given,
    which a learner keeps in its checkpoints so that a resumed run goes on counting."""

    def __init__(self, limits: AuditLimits | None = None, *, correctness: str | None = None,
                 log: Callable[[str], None] = print) -> None:
        self.limits = limits or AuditLimits()
        self.correctness = correctness
        self.log = log
        self._streaks: dict[str, int] = {}
        self._warned: set[str] = set()

    def __call__(self, *, step: int, total: Sequence[float], per_function: Mapping[str, Sequence[float]],
                 weights: Mapping[str, float], lengths: Sequence[float], finished: Sequence[bool],
                 group_size: int) -> dict[str, float]:
        metrics, self._streaks = step_audit(total=total, per_function=per_function, weights=weights, lengths=lengths,
                                            finished=finished, group_size=group_size, streaks=self._streaks)
        found = trips(metrics, self.limits, correctness=self.correctness)
        metrics[TRIPPED] = float(len(found))
        for trip in found:
            if trip.key not in self._warned:  # once per kind and function, not every step
                self._warned.add(trip.key)
                self.log(trip.message(step))
        return metrics

    def state_json(self) -> dict[str, Any]:
        """The streaks and the warnings given, for a checkpoint."""
        return {"streaks": dict(self._streaks), "warned": sorted(self._warned)}

    def restore_json(self, data: Mapping[str, Any]) -> None:
        """Continue a resumed run from `state_json`'s record ({}: from scratch)."""
        self._streaks = {str(k): int(v) for k, v in data.get("streaks", {}).items()}
        self._warned = set(data.get("warned", ()))


def summarize(records: Iterable[Mapping[str, float]], limits: AuditLimits, *, correctness: str | None
              ) -> dict[str, dict[str, float]]:
    """For each audit that tripped in the logged records: on how many steps, the first, and its worst value."""
    out: dict[str, dict[str, float]] = {}
    for record in records:
        for trip in trips(record, limits, correctness=correctness):
            seen = out.setdefault(trip.key, {"steps": 0, "first_step": record.get("step", 0), "worst": trip.value})
            seen["steps"] += 1
            seen["worst"] = max(seen["worst"], trip.value)
    return out
