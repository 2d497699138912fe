"""Reward audits: the numbers that show a reward paying for something other than the task.

Pure functions on one step's scores (``RewardResult.per_function``, the weighted total)
and what the rollout knows of each completion (its length in tokens, whether it finished
with EOS / a stop rather than at ``max_new_tokens``), plus a probe that scores a few
adversarial completions once, before training. Plain Python floats, like the manager.

Why these: in Marin's async GSM8K study the raw reward counted 120 of 128 answers
correct while only 64 completions had finished (marin-community/marin#8955); reward
models that prefer longer answers show up as reward rising with length (Singhal et al.,
"A Long Way to Go", arXiv:2310.03716); a reward that never varies within a group gives
GRPO no advantage at all (DeepSeekMath, arXiv:2402.03300, eq. for A_i); and a reward
that pays an empty or echoed answer is the textbook hack (Skalse et al., arXiv:2209.13085).
The stateful part (streaks, thresholds, warnings) is ``rewards.auditor``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "ADVERSARIAL_KINDS",
    "ProbeResult",
    "adversarial_completions",
    "constant_in_groups",
    "length_correlation",
    "next_streak",
    "probe_rewards",
    "reward_shares",
    "unfinished_rewarded",
]


def unfinished_rewarded(total: Sequence[float], finished: Sequence[bool]) -> float:
    """Share of the rewarded completions (total > 0) that did not finish; 0.0 when none is rewarded.

    A completion that did not finish hit ``max_new_tokens`` without EOS or a stop
    string: its answer is cut off, so a reward that pays it pays something else.
    """
    _same_length(total, finished, "total", "finished")
    rewarded = [done for score, done in zip(total, finished) if score > 0]
    return sum(not done for done in rewarded) / len(rewarded) if rewarded else 0.0


def length_correlation(total: Sequence[float], lengths: Sequence[float]) -> float:
    """Pearson correlation of reward with completion length over the batch; 0.0 when either is constant.

    r = sum((x - mx)(y - my)) / sqrt(sum((x - mx)^2) sum((y - my)^2)).
    """
    _same_length(total, lengths, "total", "lengths")
    n = len(total)
    if n < 2:
        return 0.0
    mx, my = math.fsum(total) / n, math.fsum(lengths) / n
    dx = [x - mx for x in total]
    dy = [float(y) - my for y in lengths]
    sxx, syy = math.fsum(d * d for d in dx), math.fsum(d * d for d in dy)
    if sxx <= 0.0 or syy <= 0.0:
        return 0.0
    r = math.fsum(a * b for a, b in zip(dx, dy)) / math.sqrt(sxx * syy)
    return max(-1.0, min(1.0, r))  # rounding can step a hair past +-1


def constant_in_groups(scores: Sequence[float], group_size: int) -> bool:
    """True when every group (``group_size`` consecutive scores) holds one value: no advantage anywhere."""
    if group_size < 1 or len(scores) % group_size:
        raise ValueError(f"{len(scores)} scores do not split into groups of {group_size}")
    return all(
        max(scores[i : i + group_size]) == min(scores[i : i + group_size]) for i in range(0, len(scores), group_size)
    )


def next_streak(streak: int, constant: bool) -> int:
    """Consecutive steps on which a reward was constant in every group, after one more step."""
    return streak + 1 if constant else 0


def reward_shares(per_function: Mapping[str, Sequence[float]], weights: Mapping[str, float]) -> dict[str, float]:
    """Each function's share of the weighted total's magnitude, summed over the batch.

    share_k = sum_i |w_k s_ki| / sum_j sum_i |w_j s_ji|; every share is 0.0 when all
    contributions are 0. The shares of the functions sum to 1 otherwise. A function missing
    from `weights` weighs 1.
    """
    sizes = {name: math.fsum(abs(weights.get(name, 1.0) * s) for s in scores) for name, scores in per_function.items()}
    whole = math.fsum(sizes.values())
    return {name: (size / whole if whole > 0 else 0.0) for name, size in sizes.items()}


ADVERSARIAL_KINDS = ("empty", "echo", "repeat")
"""The probe's completions: nothing at all, the prompt itself, and one word repeated to the length limit."""

_REPEATED = "the "


def adversarial_completions(prompt: str, *, max_new_tokens: int) -> dict[str, str]:
    """The probe's completions for one prompt, by kind (``ADVERSARIAL_KINDS``).

    The repetition has ``max_new_tokens`` words, so at least that many tokens in any
    tokenizer: it stands for a completion cut off at the limit.
    """
    return {"empty": "", "echo": prompt, "repeat": _REPEATED * max_new_tokens}


@dataclass(frozen=True)
class ProbeResult:
    """What each reward function paid the adversarial completions."""

    mean: dict[str, dict[str, float]]
    """``mean[function][kind]``: the function's mean score over the probe's prompts."""
    paid: dict[str, dict[str, int]]
    """``paid[function][kind]``: on how many of the prompts it scored > 0."""
    prompts: int
    """How many prompts were probed."""
    failed: dict[str, str]
    """Functions that raised or returned a bad score on an adversarial completion: the error."""

    @property
    def flagged(self) -> dict[str, list[str]]:
        """Functions that pay an adversarial kind (score > 0) on at least half the prompts: their kinds."""
        out = {}
        for name, by_kind in self.paid.items():
            kinds = [kind for kind, count in by_kind.items() if self.prompts and 2 * count >= self.prompts]
            if kinds:
                out[name] = kinds
        return out

    def to_json(self) -> dict[str, object]:
        return {"prompts": self.prompts, "mean": self.mean, "paid": self.paid, "flagged": self.flagged,
                "failed": self.failed}


def probe_rewards(
    score: Callable[[str, Sequence[str], Sequence[str], Mapping[str, Sequence[object]]], Sequence[float]],
    names: Sequence[str],
    prompts: Sequence[str],
    fields: Mapping[str, Sequence[object]],
    *,
    max_new_tokens: int,
    length_of: Callable[[str], int] = len,
    completion_fields: Callable[[Sequence[int], Sequence[str]], Mapping[str, Sequence[object]]] | None = None,
) -> ProbeResult:
    """Score every adversarial completion of every prompt with each function, once.

    ``score(name, prompts, completions, fields)`` scores with function ``name`` alone
    (raising to report a failure); ``fields`` hold one entry per prompt (e.g. the
    reference ``answer``) and are repeated per completion, with ``completion_lengths``
    added as the pipeline passes it (``length_of`` the text; the repetition at the limit).
    ``completion_fields(prompt_indices, completions)``, called once with every row, adds
    fields that depend on the completion too (a multi-turn run's ``episode``), one entry per row.
    """
    rows = [(p, kind, text) for i, p in enumerate(prompts)
            for kind, text in adversarial_completions(p, max_new_tokens=max_new_tokens).items()]
    owner = [i for i in range(len(prompts)) for _ in ADVERSARIAL_KINDS]
    row_fields = {k: [v[i] for i in owner] for k, v in fields.items()}
    if completion_fields is not None:
        row_fields |= {k: list(v) for k, v in completion_fields(owner, [t for _, _, t in rows]).items()}
    row_fields["completion_lengths"] = [
        max_new_tokens if kind == "repeat" else min(length_of(text), max_new_tokens) for _, kind, text in rows
    ]
    mean: dict[str, dict[str, float]] = {}
    paid: dict[str, dict[str, int]] = {}
    failed: dict[str, str] = {}
    for name in names:
        try:
            scores = list(score(name, [p for p, _, _ in rows], [t for _, _, t in rows], row_fields))
        except Exception as e:  # noqa: BLE001 - a probe reports a failing reward; the run's own checks stop it
            failed[name] = f"{type(e).__name__}: {e}"
            continue
        mean[name] = {kind: _mean([s for s, (_, k, _) in zip(scores, rows) if k == kind]) for kind in ADVERSARIAL_KINDS}
        paid[name] = {kind: sum(s > 0 for s, (_, k, _) in zip(scores, rows) if k == kind) for kind in ADVERSARIAL_KINDS}
    return ProbeResult(mean=mean, paid=paid, prompts=len(prompts), failed=failed)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def _same_length(a: Sequence[object], b: Sequence[object], name_a: str, name_b: str) -> None:
    if len(a) != len(b):
        raise ValueError(f"{name_a} has {len(a)} entries, {name_b} {len(b)}")
