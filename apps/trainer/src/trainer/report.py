"""The comparison report: a Markdown table, a JSON file and PNG plots."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

COLUMNS = (
    ("variant", "{}"),
    ("acc before", "{:.3f}"),
    ("acc after", "{:.3f}"),
    ("pass@k after", "{:.3f}"),
    ("len correct", "{:.2f}"),
    ("len incorrect", "{:.2f}"),
    ("uniform groups", "{:.3f}"),
    ("generated tokens", "{:,.0f}"),
    ("wall s", "{:.1f}"),
)


def table_rows(summaries: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for s in summaries:
        after = s["after"]
        pass_key = next((k for k in after if k.startswith("eval/pass@")), None)
        values = (
            s["algo"],
            s["before"]["eval/accuracy"],
            after["eval/accuracy"],
            after[pass_key] if pass_key else float("nan"),
            after["eval/length_correct"],
            after["eval/length_incorrect"],
            s["uniform_frac_mean"],
            s["generated_tokens"],
            s["train_seconds"],
        )
        rows.append([fmt.format(v) for (_, fmt), v in zip(COLUMNS, values, strict=True)])
    return rows


def markdown_table(summaries: Sequence[Mapping[str, Any]]) -> str:
    header = [name for name, _ in COLUMNS]
    pass_k = next((k.split("@")[1] for s in summaries for k in s["after"] if k.startswith("eval/pass@")), "k")
    header[3] = f"pass@{pass_k} after"
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(summaries)]
    return "\n".join(lines) + "\n"


PLOTS = (
    ("accuracy_vs_step.png", "step", "eval/accuracy", "held-out greedy accuracy"),
    ("accuracy_vs_tokens.png", "tokens", "eval/accuracy", "held-out greedy accuracy"),
    ("reward.png", "step", "rewards/total/mean", "mean reward"),
    ("length_correct.png", "step", "eval/length_correct", "mean length of correct answers (tokens)"),
    ("length_incorrect.png", "step", "eval/length_incorrect", "mean length of incorrect answers (tokens)"),
    ("uniform_groups.png", "step", "groups/uniform_frac", "fraction of uniform groups"),
    ("entropy.png", "step", "train/entropy", "policy entropy (nats/token)"),
)


def plot_histories(histories: Mapping[str, Sequence[Mapping[str, Any]]], out: Path) -> list[Path]:
    """One PNG per metric, one line per variant; returns the files written."""
    written = []
    for name, x_kind, key, label in PLOTS:
        fig, ax = plt.subplots(figsize=(6, 4))
        for algo, history in histories.items():
            xs, ys, tokens = [], [], 0.0
            for record in history:
                tokens += record.get("perf/generated_tokens", 0.0)
                if isinstance(record.get(key), (int, float)):
                    xs.append(record["step"] if x_kind == "step" else tokens)
                    ys.append(record[key])
            ax.plot(xs, ys, marker="." if len(xs) < 30 else None, label=algo)
        ax.set_xlabel("training step" if x_kind == "step" else "generated tokens")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def write_report(
    out: Path, summaries: Sequence[Mapping[str, Any]], histories: Mapping[str, Sequence[Mapping[str, Any]]]
) -> str:
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(summaries)
    plots = plot_histories(histories, out)
    (out / "results.json").write_text(json.dumps({"variants": list(summaries)}, indent=2))
    body = ["# Comparison", "", table, ""] + [f"![{p.stem}]({p.name})" for p in plots]
    (out / "report.md").write_text("\n".join(body) + "\n")
    return table
