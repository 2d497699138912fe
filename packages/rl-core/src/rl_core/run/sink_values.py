"""What every sink writes, in one form: a record's scalar metrics and a step's samples table
(the same columns in TensorBoard, W&B, MLflow and trackio; the console table of
rl_core.run.console_samples shows the same fields)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

SAMPLE_COLUMNS = ("step", "id", "prompt", "completion", "length", "reward", "advantage")
"""A samples table's first columns; one `reward/<function>` column per reward function follows."""
SHOWN_CHARS = 300
"""Longest prompt or completion shown in a TensorBoard text table (the JSONL keeps them whole)."""


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics record (no step, no strings)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def reward_functions(samples: Sequence[Mapping[str, Any]]) -> list[str]:
    """The reward functions the samples were scored with (their `rewards`), in order of appearance."""
    return list(dict.fromkeys(name for s in samples for name in s.get("rewards", {})))


def sample_table(step: int, samples: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows) of one step's samples: SAMPLE_COLUMNS, then each reward function's score
    as `reward/<name>` (None where a sample lacks one, e.g. a record from before they were kept)."""
    functions = reward_functions(samples)
    columns = [*SAMPLE_COLUMNS, *(f"reward/{name}" for name in functions)]
    rows = [
        [step if c == "step" else s.get(c) for c in SAMPLE_COLUMNS] + [s.get("rewards", {}).get(n) for n in functions]
        for s in samples
    ]
    return columns, rows


def samples_markdown(samples: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table of samples (TensorBoard renders text summaries as Markdown)."""

    def cell(value: Any) -> str:
        text = "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
        text = text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."
        return text.replace("|", "\\|").replace("\n", "⏎")

    columns, rows = sample_table(0, samples)
    lines = ["| " + " | ".join(columns[1:]) + " |", "|" + "---|" * (len(columns) - 1)]
    lines += ["| " + " | ".join(cell(v) for v in row[1:]) + " |" for row in rows]
    return "\n".join(lines)
