"""Comparison plots: one PNG per metric, one line per variant, mean over seeds with a 95% band.

Training curves (logged every step, noisy) are drawn smoothed, with the raw
mean as a faint line behind; evaluation curves are drawn as they are, when
there are at least MIN_CURVE_POINTS evaluations (else the report's tables
show them). Seeds are aligned by step; against tokens or seconds the x value of
a step is its mean over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from trainer.compare.stats import mean_ci  # noqa: E402

# (file, x axis, metric key, title, y label, smoothed)
PLOTS = (
    ("accuracy_vs_step.png", "step", "eval/accuracy", "Held-out accuracy by training step", "greedy accuracy", False),
    ("accuracy_vs_tokens.png", "tokens", "eval/accuracy", "Held-out accuracy by generated tokens", "greedy accuracy", False),
    ("accuracy_vs_time.png", "seconds", "eval/accuracy", "Held-out accuracy by training time", "greedy accuracy", False),
    ("reward.png", "step", "rewards/total/mean", "Mean training reward", "reward", True),
    ("kl.png", "step", "train/kl", "KL to the reference policy (variants with beta > 0)", "KL (nats/token)", True),
    ("clip_frac_low.png", "step", "train/clip_frac_low", "Tokens clipped below 1 - eps_low", "fraction of tokens", True),
    ("clip_frac_high.png", "step", "train/clip_frac_high", "Tokens clipped above 1 + eps_high", "fraction of tokens", True),
    ("grad_norm.png", "step", "train/grad_norm", "Gradient norm before clipping", "global norm", True),
    ("response_length.png", "step", "completions/length_mean", "Mean training completion length", "tokens", True),
    ("uniform_groups.png", "step", "groups/uniform_frac", "Groups with equal rewards (no signal)", "fraction of groups", True),
    ("entropy.png", "step", "train/entropy", "Policy entropy", "nats/token", True),
    ("length_correct.png", "step", "eval/length_correct", "Length of correct held-out answers", "tokens", False),
    ("length_incorrect.png", "step", "eval/length_incorrect", "Length of incorrect held-out answers", "tokens", False),
)
X_LABELS = {"step": "training step", "tokens": "generated tokens", "seconds": "training seconds"}

MIN_CURVE_POINTS = 8
"""An evaluation curve (unsmoothed) is drawn only with at least this many evaluations; with
fewer (150 steps evaluated every 50: 4 points) the report shows them as a table instead
(`trainer.compare.report.evaluation_tables`), which reads better than a few overlapping bands."""


def series(history: Sequence[Mapping[str, Any]], key: str) -> dict[int, tuple[float, float, float]]:
    """{step: (cumulative generated tokens, cumulative step seconds, value)} where `key` was logged."""
    out, tokens, seconds = {}, 0.0, 0.0
    for record in history:
        tokens += record.get("perf/generated_tokens", 0.0)
        seconds += record.get("time/step", 0.0)
        value = record.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[record["step"]] = (tokens, seconds, float(value))
    return out


def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """Exponential moving average, debiased (as TensorBoard's smoothing) so the start is not pulled to 0."""
    out, acc, norm = np.empty_like(values), 0.0, 0.0
    for i, v in enumerate(values):
        acc, norm = weight * acc + (1 - weight) * v, weight * norm + (1 - weight)
        out[i] = acc / norm
    return out


def smoothing_weight(points: int) -> float:
    """No smoothing up to 20 points; about a 1/20 of the run's window for long runs (never below 0: a
    negative weight makes the debiasing normaliser 0 at 10 points, and the curve infinite)."""
    return min(0.95, max(0.0, 1.0 - 20.0 / points))


def aligned(histories: Sequence[Sequence[Mapping[str, Any]]], key: str, x_kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(x [steps], y [seeds, steps]) over the steps every seed logged."""
    per_seed = [series(h, key) for h in histories]
    steps = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
    column = {"tokens": 0, "seconds": 1}.get(x_kind)
    if column is None:
        x = np.asarray(steps, float)
    else:
        x = np.asarray([np.mean([s[step][column] for s in per_seed]) for step in steps])
    y = np.asarray([[s[step][2] for step in steps] for s in per_seed]).reshape(len(per_seed), len(steps))
    return x, y


def band(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) over seeds (axis 0); low == high == mean for one seed."""
    estimates = [mean_ci(list(column)) for column in y.T]
    mean = np.asarray([e.mean for e in estimates])
    half = np.asarray([0.0 if math.isnan(e.half_width) else e.half_width for e in estimates])
    return mean, mean - half, mean + half


def plot_runs(runs: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]], out: Path) -> list[Path]:
    """One PNG per entry of PLOTS; `runs` maps each variant to its seeds' metric histories.

    Evaluation curves with fewer than MIN_CURVE_POINTS points are not drawn (see there).
    """
    written = []
    for name, x_kind, key, title, label, smoothed in PLOTS:
        points = max((aligned(h, key, x_kind)[0].size for h in runs.values()), default=0)
        if not smoothed and 0 < points < MIN_CURVE_POINTS:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        drawn = False
        for algo, histories in runs.items():
            x, y = aligned(histories, key, x_kind)
            if x.size == 0:
                continue
            drawn = True
            if smoothed:
                weight = smoothing_weight(x.size)
                (line,) = ax.plot(x, y.mean(0), alpha=0.25, linewidth=0.8)
                mean, low, high = band(np.stack([smooth(row, weight) for row in y]))
                ax.plot(x, mean, color=line.get_color(), label=algo)
            else:
                mean, low, high = band(y)
                (line,) = ax.plot(x, mean, marker="." if x.size < 30 else None, label=algo)
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        seeds = max((len(h) for h in runs.values()), default=0)
        ax.set_title(f"{title}\n(mean of {seeds} seed{'s' if seeds != 1 else ''}, 95% band)", fontsize=10)
        ax.set_xlabel(X_LABELS[x_kind])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend()
        else:
            ax.text(0.5, 0.5, f"no variant logged {key}", ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
