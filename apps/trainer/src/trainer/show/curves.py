"""`trainer show`'s curves of one run: one PNG per panel, and all panels in overview.png.

The panels are the curves that tell how a run goes: the reward (the total and each reward
function's mean), held-out accuracy (with the evaluation before RL at step 0 and the final one at
the last step), completion length, KL to the reference, entropy, the clipped fraction, the
sampler/trainer mismatch and the staleness of the rollouts, and each phase's seconds per step.
Noisy per-step curves are drawn smoothed over a faint raw line (as `trainer compare` draws
them); evaluations are drawn as points. A panel whose metrics the run never logged says so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from trainer.compare.plots import smooth, smoothing_weight  # noqa: E402

REWARD_FUNCTION_MEAN = ("rewards/", "/mean")
"""rewards/<function>/mean: each reward function's mean score (rewards/total/mean: the weighted total)."""
PHASES = ("time/rollout", "time/reward", "time/logprob", "time/update")
"""The phases of a step, in order (time/step: the whole step)."""


@dataclasses.dataclass(frozen=True)
class Panel:
    file: str
    title: str
    ylabel: str
    keys: tuple[str, ...] = ()
    """Metric keys drawn as curves (more are found by `curves`)."""
    points: bool = False
    """Evaluations (logged every few steps): points joined by lines, not smoothed."""
    log_scale: bool = False
    """A logarithmic y axis (step times: the first steps compile, and would flatten the rest)."""


PANELS = (
    Panel("reward.png", "Reward: total and each reward function", "mean score", ("rewards/total/mean",)),
    Panel("accuracy.png", "Held-out accuracy (step 0: before RL)", "accuracy", ("eval/accuracy",), points=True),
    Panel("length.png", "Completion length", "tokens", ("completions/length_mean", "completions/length_max")),
    Panel("kl.png", "KL to the reference policy", "nats/token", ("train/kl",)),
    Panel("entropy.png", "Policy entropy", "nats/token", ("train/entropy",)),
    Panel("clip_fraction.png", "Clipped tokens", "fraction of tokens", ("train/clip_frac_low", "train/clip_frac_high")),
    Panel("mismatch_staleness.png", "Sampler mismatch and staleness", "|logp diff| / steps behind",
          ("rollout/mismatch_logp_abs_mean", "rollout/staleness_logp_abs_mean", "rollout/staleness_version_lag")),
    Panel("step_time.png", "Seconds per step, by phase (first steps compile)", "seconds (log scale)",
          ("time/step", *PHASES), log_scale=True),
)
OVERVIEW = "overview.png"


def curves(panel: Panel, history: Sequence[Mapping[str, Any]]) -> list[str]:
    """The metric keys `panel` draws for this run: its own, and for the reward panel each
    reward function's mean, in the order the run logged them."""
    keys = list(panel.keys)
    if panel.file == "reward.png":
        start, end = REWARD_FUNCTION_MEAN
        for record in history:
            keys += [k for k in record if k.startswith(start) and k.endswith(end) and k.count("/") == 2 and k not in keys]
        keys = [keys[0], *sorted(keys[1:])]
    if panel.points:
        keys += sorted({k for r in history for k in r if k.startswith("eval/pass@")} - set(keys))
    return [k for k in keys if any(_finite(r.get(k)) for r in history)]


def series(history: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) where `key` was logged with a finite number."""
    pairs = [(r["step"], float(r[key])) for r in history if _finite(r.get(key))]
    return np.asarray([p[0] for p in pairs], float), np.asarray([p[1] for p in pairs], float)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def with_evaluations(history: Sequence[Mapping[str, Any]], before: Mapping[str, Any] | None,
                     after: Mapping[str, Any] | None, steps: int | None) -> list[dict[str, Any]]:
    """`history` with the evaluation before RL as step 0 and the final one at the last step
    (the run's own records hold only the evaluations made during training)."""
    out = [dict(r) for r in history]
    evals = lambda record: {k: v for k, v in (record or {}).items() if k.startswith("eval/")}  # noqa: E731
    if before:
        out.insert(0, {"step": 0, **evals(before)})
    if after and steps is not None:
        last = next((r for r in out if r["step"] == steps), None)
        if last is None:
            out.append({"step": steps, **evals(after)})
        else:
            last.update({k: v for k, v in evals(after).items() if not _finite(last.get(k))})
    return out


def draw(ax: Any, panel: Panel, history: Sequence[Mapping[str, Any]]) -> bool:
    """Draw `panel` on `ax`; False when the run logged none of its metrics."""
    keys = curves(panel, history)
    for key in keys:
        x, y = series(history, key)
        label = key.removeprefix("rewards/").removesuffix("/mean") if panel.file == "reward.png" else key
        if panel.points:
            ax.plot(x, y, marker="o", label=label)
        elif x.size >= 10:
            (line,) = ax.plot(x, y, alpha=0.25, linewidth=0.8)
            ax.plot(x, smooth(y, smoothing_weight(x.size)), color=line.get_color(), label=label)
        else:
            ax.plot(x, y, marker=".", label=label)
    if panel.log_scale and keys:
        ax.set_yscale("log")
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel("training step")
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    if keys:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "not logged by this run", ha="center", va="center", transform=ax.transAxes)
    return bool(keys)


def plot_run(history: Sequence[Mapping[str, Any]], out: Path, *, title: str) -> list[Path]:
    """One PNG per panel and overview.png (every panel, titled `title`) in `out`; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for panel in PANELS:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        draw(ax, panel, history)
        # fixed margins, not tight_layout: it measures every label by drawing the figure once more
        fig.subplots_adjust(left=0.13, right=0.97, bottom=0.12, top=0.92)
        fig.savefig(out / panel.file, dpi=100)
        plt.close(fig)
        written.append(out / panel.file)
    columns = 4
    rows = math.ceil(len(PANELS) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.6 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, PANELS, strict=False):
        draw(ax, panel, history)
    for ax in list(axes.flat)[len(PANELS):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=12)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.08, top=0.9, wspace=0.28, hspace=0.38)
    fig.savefig(out / OVERVIEW, dpi=100)
    plt.close(fig)
    return [out / OVERVIEW, *written]
