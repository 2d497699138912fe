"""Statistics over seeds: mean with a 95% confidence interval, and Welch's t-test.

A few seeds are few samples, so the interval uses Student's t (not the normal
1.96), and two variants differ significantly only when Welch's test (no
equal-variance assumption) says so at the 5% level after Holm's correction for
testing every pair: seven variants make 21 tests, and at an uncorrected 5%
about one of them would be "significant" by chance alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from scipy import stats as scipy_stats

LEVEL = 0.95
"""Confidence level of the intervals; significance is tested at 1 - LEVEL."""


class Estimate(NamedTuple):
    mean: float
    half_width: float
    """Half the width of the 95% confidence interval of the mean; nan for one value."""
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width


def mean_ci(values: Sequence[float]) -> Estimate:
    """Mean and t-based 95% interval half-width: t(0.975, n-1) * s / sqrt(n), s with ddof=1."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = math.fsum(values) / n
    if n == 1:
        return Estimate(mean, math.nan, 1)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return Estimate(mean, float(scipy_stats.t.ppf(0.5 + LEVEL / 2, n - 1)) * sd / math.sqrt(n), n)


def welch_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of Welch's t-test that `a` and `b` have the same mean (nan below 2 values each)."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    ma, mb = math.fsum(a) / len(a), math.fsum(b) / len(b)
    va = math.fsum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = math.fsum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    if va + vb == 0.0:  # every seed gave the same value in both: certain, either way
        return 1.0 if ma == mb else 0.0
    t = (ma - mb) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va**2 / (len(a) - 1) if va else 0.0) + (vb**2 / (len(b) - 1) if vb else 0.0))
    return float(2.0 * scipy_stats.t.sf(abs(t), df))


def one_sample_p_value(values: Sequence[float]) -> float:
    """Two-sided p-value of the one-sample t-test that `values` have mean 0 (nan below 2 values, or when all
    are equal: a few seeds agreeing on an accuracy counted on a few rows is no evidence of no spread)."""
    if len(values) < 2:
        return math.nan
    mean = math.fsum(values) / len(values)
    var = math.fsum((x - mean) ** 2 for x in values) / (len(values) - 1) / len(values)
    if var == 0.0:
        return math.nan
    return float(2.0 * scipy_stats.t.sf(abs(mean / math.sqrt(var)), len(values) - 1))


def significant(p_value: float) -> bool:
    return not math.isnan(p_value) and p_value < 1.0 - LEVEL


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the given order (nan stays nan and is not counted).

    The k-th smallest of m p-values becomes max over j <= k of (m - j + 1) * p_(j),
    capped at 1, so "adjusted p < 0.05" controls the chance of any false positive.
    """
    order = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    m = len(order)
    out = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out
