"""The comparison report: a Markdown table over seeds, results.json and PNG plots.

Every number in the table is a mean over seeds with its 95% confidence
interval (`mean ± half-width`); results.json also keeps each seed's values.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainer.compare.plots import MIN_CURVE_POINTS, PLOTS, plot_runs
from trainer.settings import RunSettings
from trainer.compare.stats import LEVEL, holm_adjust, mean_ci, one_sample_p_value, significant, welch_p_value

__all__ = ["COLUMNS", "PLOTS", "markdown_table", "seed_values", "write_report"]

# (header, key in seed_values, format); "pass@k" is spelled with the run's k
COLUMNS = (
    ("variant", "algo", "{}"),
    ("acc before", "acc_before", "{:.3f}"),
    ("acc after", "acc_after", "{:.3f}"),
    ("pass@k before", "pass_before", "{:.3f}"),
    ("pass@k after", "pass_after", "{:.3f}"),
    ("clip low", "clip_low", "{:.4f}"),
    ("clip high", "clip_high", "{:.4f}"),
    ("uniform groups", "uniform", "{:.3f}"),
    ("generated tokens", "tokens", "{:,.0f}"),
    ("wall s, seed 1", "wall_first", "{:.1f}"),
    ("wall s, later seeds", "wall_later", "{:.1f}"),
)
"""The first seed of each variant compiles its programs (or loads them from the cache) and the
others do not: its training time is a column of its own, so that the later seeds' interval
measures seed-to-seed spread, not compilation (it was 21.5 ± 29.0 s over all three)."""

NUMERIC = [
    "acc_before", "acc_after", "pass_before", "pass_after", "clip_low", "clip_high", "uniform", "tokens", "wall",
]  # fmt: skip
"""The keys of `seed_values`: results.json's per-seed values, means and intervals (wall over every seed)."""


def column_values(per_seed: Sequence[Mapping[str, float]], key: str) -> list[float]:
    """The values of one table column over a variant's seeds."""
    if key == "wall_first":
        return [per_seed[0]["wall"]]
    if key == "wall_later":
        return [s["wall"] for s in per_seed[1:]] or [math.nan]
    return [s[key] for s in per_seed]


def _pass_key(metrics: Mapping[str, Any]) -> str | None:
    return next((k for k in metrics if k.startswith("eval/pass@")), None)


def _mean_of(history: Sequence[Mapping[str, Any]], key: str) -> float:
    values = [r[key] for r in history if isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else 0.0


def seed_values(summary: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The table's numbers for one seed's run (clip fractions: the mean over its steps)."""
    before, after = summary["before"], summary["after"]
    pass_key = _pass_key(after)
    return {
        "acc_before": before["eval/accuracy"],
        "acc_after": after["eval/accuracy"],
        "pass_before": before[pass_key] if pass_key else math.nan,
        "pass_after": after[pass_key] if pass_key else math.nan,
        "clip_low": _mean_of(history, "train/clip_frac_low"),
        "clip_high": _mean_of(history, "train/clip_frac_high"),
        "uniform": summary["uniform_frac_mean"],
        "tokens": summary["generated_tokens"],
        "wall": summary["train_seconds"],
    }


def _cell(fmt: str, values: Sequence[float]) -> str:
    if all(math.isnan(v) for v in values):
        return "-"  # e.g. the later seeds of a one-seed comparison
    est = mean_ci(values)
    if math.isnan(est.half_width) or all(v == values[0] for v in values):
        return fmt.format(est.mean)  # one seed, or the same value for every seed (e.g. the shared base)
    return f"{fmt.format(est.mean)} ± {fmt.format(est.half_width)}"


def markdown_table(variants: Sequence[Mapping[str, Any]]) -> str:
    """One row per variant; `variants` hold "algo" and "per_seed" (a list of seed_values)."""
    k = next((v["pass_k"] for v in variants if v.get("pass_k")), "k")
    header = [name.replace("pass@k", f"pass@{k}") for name, _, _ in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for v in variants:
        cells = [v["algo"]] + [_cell(fmt, column_values(v["per_seed"], key)) for _, key, fmt in COLUMNS[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def comparisons(variants: Sequence[Mapping[str, Any]], key: str = "acc_after") -> list[dict[str, Any]]:
    """Every pair of variants: the difference of the means of `key`, Welch's p-value and its Holm adjustment."""
    out = []
    for a, b in itertools.combinations(variants, 2):
        xa, xb = [s[key] for s in a["per_seed"]], [s[key] for s in b["per_seed"]]
        p = welch_p_value(xa, xb)
        out.append(
            {
                "a": a["algo"],
                "b": b["algo"],
                "metric": key,
                "difference": mean_ci(xa).mean - mean_ci(xb).mean,
                "p_value": p,
            }
        )
    for pair, adjusted in zip(out, holm_adjust([pair["p_value"] for pair in out]), strict=True):
        pair["p_holm"] = adjusted
        pair["significant"] = significant(adjusted)
    return out


def gains(variants: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each variant's held-out gain under RL: acc after - acc before per seed, its mean and 95% half-width,
    the one-sample t-test's p-value that it is 0 and its Holm adjustment over the variants."""
    out = []
    for v in variants:
        gain = [s["acc_after"] - s["acc_before"] for s in v["per_seed"]]
        est = mean_ci(gain)
        out.append({"variant": v["algo"], "gain": est.mean, "ci95": est.half_width, "p_value": one_sample_p_value(gain)})
    for row, adjusted in zip(out, holm_adjust([row["p_value"] for row in out]), strict=True):
        row["p_holm"] = adjusted
        row["significant"] = significant(adjusted)
    return out


def gain_text(rows: Sequence[Mapping[str, Any]], seeds: int) -> str:
    if seeds < 2:
        return ""
    lines = [f"Held-out accuracy gain under RL (after - before), one-sample t-test over {seeds} seeds; p-values "
             f"Holm-adjusted over {len(rows)} variant{'' if len(rows) == 1 else 's'}:"]
    for row in rows:
        if math.isnan(row["p_value"]):
            lines.append(f"- {row['variant']}: {row['gain']:+.3f}, not tested: every seed gave the same gain")
            continue
        verdict = ("a significant gain" if row["gain"] > 0 else "a significant loss") if row["significant"] \
            else "not significant"
        lines.append(f"- {row['variant']}: {row['gain']:+.3f} ± {row['ci95']:.3f} (p = {row['p_value']:.3f}, "
                     f"adjusted {row['p_holm']:.3f}), {verdict}")
    return "\n".join(lines) + "\n"


def significance_text(pairs: Sequence[Mapping[str, Any]], seeds: int) -> str:
    if seeds < 2:
        return "One seed: no confidence intervals and no significance test (use --seeds 2 or more).\n"
    alpha = f"{1 - LEVEL:.0%}"
    lines = [
        f"Held-out accuracy after RL, Welch's t-test over {seeds} seeds per variant; p-values Holm-adjusted "
        f"over {len(pairs)} pair{'' if len(pairs) == 1 else 's'} (significant: adjusted p < {alpha}):"
    ]
    for c in pairs:
        verdict = "significant" if c["significant"] else "not significant"
        lines.append(
            f"- {c['a']} - {c['b']}: {c['difference']:+.3f} (p = {c['p_value']:.3f}, adjusted {c['p_holm']:.3f}), {verdict}"
        )
    if not any(c["significant"] for c in pairs):
        lines.append(f"No difference is significant at {alpha} with {seeds} seeds.")
    return "\n".join(lines) + "\n"


EVALUATION_TABLES = (
    ("eval/accuracy", "Held-out greedy accuracy", "{:.3f}"),
    ("eval/length_correct", "Length of correct held-out answers (tokens)", "{:.2f}"),
    ("eval/length_incorrect", "Length of incorrect held-out answers (tokens)", "{:.2f}"),
)


def evaluation_tables(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Markdown lines: per evaluation metric, one row per variant and one column per evaluated
    step (mean ± 95% half-width over seeds); steps are those every seed of every variant evaluated."""
    histories = {algo: [r["history"] for r in seed_runs] for algo, seed_runs in runs.items()}
    lines = []
    for key, title, fmt in EVALUATION_TABLES:
        per_algo = {algo: [{r["step"]: r[key] for r in h if isinstance(r.get(key), (int, float))} for h in hs]
                    for algo, hs in histories.items()}
        steps = sorted(set.intersection(*(set(seed) for seeds in per_algo.values() for seed in seeds)))
        if not steps:
            continue
        lines += [f"### {title}, by step", "", "| variant | " + " | ".join(f"step {n}" for n in steps) + " |",
                  "|" + "---|" * (len(steps) + 1)]
        for algo, seeds in per_algo.items():
            lines.append(f"| {algo} | " + " | ".join(_cell(fmt, [s[n] for s in seeds]) for n in steps) + " |")
        lines.append("")
    return lines


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in d.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_diff(settings: RunSettings, reference: RunSettings) -> dict[str, dict[str, Any]]:
    """{field: {reference variant: value, this variant: value}} of the algorithm fields that differ,
    then of the training and rollout settings a variant sets apart (`training.async_rollout`); a
    field only one of them has appears with only that one's value. The batch shape is left out:
    every variant spends the same completions per step (the report's settings say how)."""
    def fields(s: RunSettings) -> dict[str, Any]:
        resolved = s.resolved()
        out = _flatten(resolved["algorithm"])
        for section in ("training", "rollout"):
            out.update({k: v for k, v in _flatten(resolved[section], f"{section}.").items() if k not in BATCH_SHAPE})
        return out

    mine, ref = fields(settings), fields(reference)
    out = {}
    for key in [*ref, *(k for k in mine if k not in ref)]:
        if ref.get(key, ...) != mine.get(key, ...):
            out[key] = {name: d[key] for name, d in ((reference.name, ref), (settings.name, mine)) if key in d}
    return out


BATCH_SHAPE = ("training.prompts_per_step", "training.mini_batch_size", "training.seed", "rollout.seed")
"""Settings `trainer compare` itself sets per variant and seed, not differences between variants."""


def _diff_text(diff: Mapping[str, Mapping[str, Any]], reference: str, algo: str) -> str:
    parts = []
    for key, values in diff.items():
        if reference in values and algo in values:
            parts.append(f"`{key}` {values[reference]!r} -> {values[algo]!r}")
        elif algo in values:
            parts.append(f"`{key}` = {values[algo]!r} (not a {reference} field)")
        else:
            parts.append(f"`{key}` (a {reference} field only)")
    return ", ".join(parts) or "none"


def settings_text(first: RunSettings, all_settings: Sequence[RunSettings], seeds: int, wall: float) -> list[str]:
    t, e = first.training, first.eval
    shapes: dict[tuple[int, int], list[str]] = {}  # (prompts, completions per prompt) -> variants
    for s in all_settings:
        shapes.setdefault((s.training.prompts_per_step, s.algorithm_config().group_size), []).append(s.name)
    if len(shapes) == 1:
        ((prompts, g),) = shapes
        batch = f"{prompts} prompts x {g} completions per step"
    else:  # the same completions per step (trainer.compare.sweep.same_completions), other group sizes
        batch = f"{t.prompts_per_step * first.algorithm_config().group_size} completions per step: " + (
            "; ".join(f"{p} prompts x {g} ({', '.join(algos)})" for (p, g), algos in shapes.items()))
    layout = f"mini-batch {t.mini_batch_size or 'whole step'}, micro-batch {t.micro_batch_size or 'whole mini-batch'}"
    return [
        "## Settings",
        "",
        f"- task: {first.task.name} {first.task.options or ''}".rstrip(),
        f"- base policy: {first.warm_start_steps} warm-start steps, shared by every variant and seed",
        f"- steps: {t.num_steps} per run; {batch}",
        f"- batch layout: {layout}",
        f"- learning rate: {t.learning_rate:g} ({t.optimizer}, {t.lr_schedule}), max grad norm {t.max_grad_norm}",
        f"- seeds: {seeds}; run n of each variant uses training.seed {t.seed} + n and rollout.seed {first.rollout.seed} + n",
        f"- evaluation: {e.heldout_size or 'all'} held-out problems, greedy; pass@{e.pass_k} of {e.samples_per_prompt} samples",
        f"- wall time: {wall:.0f} s in all",
        "",
    ]


def _finite(value: Any) -> Any:
    """NaN (e.g. the interval of one seed) as null: results.json stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_report(
    out: Path,
    all_settings: Sequence[RunSettings],
    reference: RunSettings,
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    wall_seconds: float,
) -> tuple[str, dict[str, Any]]:
    """report.md, results.json and the plots; returns (printed text, results)."""
    out.mkdir(parents=True, exist_ok=True)
    seeds = len(next(iter(runs.values())))
    variants = []
    for settings in all_settings:
        seed_runs = runs[settings.name]
        per_seed = [seed_values(r["summary"], r["history"]) for r in seed_runs]
        estimates = {key: mean_ci([s[key] for s in per_seed]) for key in NUMERIC}
        variants.append(
            {
                "algo": settings.name,  # the variant's name: the algorithm's unless a config names variants
                "algorithm": settings.algo,
                "pass_k": settings.eval.pass_k,
                "mean": {key: e.mean for key, e in estimates.items()},
                "ci95": {key: e.half_width for key, e in estimates.items()},
                "per_seed": per_seed,
                "config_diff_vs_" + reference.name: config_diff(settings, reference),
                "summaries": [r["summary"] for r in seed_runs],
            }
        )
    pairs = comparisons(variants)
    table = markdown_table(variants)
    gained = gains(variants)
    significance = significance_text(pairs, seeds) + gain_text(gained, seeds)
    results = {
        # shared by every variant; each variant's algorithm fields are in its run folders' config.yaml
        "settings": {k: v for k, v in all_settings[0].resolved().items() if k not in ("algo", "algorithm")},
        "seeds": seeds,
        "wall_seconds": wall_seconds,
        "variants": variants,
        "comparisons": pairs,
        "gains": gained,
    }
    (out / "results.json").write_text(json.dumps(_finite(results), indent=2))
    plots = plot_runs({algo: [r["history"] for r in seed_runs] for algo, seed_runs in runs.items()}, out)

    body = ["# Comparison", "", table, significance]
    body += settings_text(all_settings[0], all_settings, seeds, wall_seconds)
    body += [f"## Config differences from {reference.name}", ""]
    for v in variants:
        body.append(f"- {v['algo']}: {_diff_text(v['config_diff_vs_' + reference.name], reference.name, v['algo'])}")
    body += ["", "## Evaluations", "", "Mean over seeds ± the half-width of the 95% confidence interval.", ""]
    body += evaluation_tables(runs)
    body += ["## Curves", "", "Mean over seeds, shaded: 95% confidence interval; training curves smoothed, raw mean faint."
             f" Evaluation curves are drawn from {MIN_CURVE_POINTS} evaluations on (`eval.every_steps`); fewer are the"
             " tables above.", ""]
    body += [f"![{p.stem}]({p.name})" for p in plots]
    (out / "report.md").write_text("\n".join(body) + "\n")
    return table + "\n" + significance, results
