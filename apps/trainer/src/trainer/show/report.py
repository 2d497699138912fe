"""`trainer show`'s terminal summary of one run: where it stands, the settings that differ from
the defaults, the curves' numbers, the reward audits' warnings, best and worst samples."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from rewards.auditor import trips
from rich.table import Table
from rl_core import ConfigError

from trainer.run.folder import flat
from trainer.settings import RunSettings, build_settings
from trainer.show.curves import PANELS, curves


def changed_settings(settings: RunSettings) -> list[tuple[str, Any, Any]]:
    """(dotted key, the run's value, the default) of each setting that differs from what
    `trainer train --algo <the run's algo>` with no other setting would use."""
    plain = lambda s: flat(json.loads(json.dumps(s.resolved())))  # noqa: E731 - tuples as lists, as YAML reads back
    ran, default = plain(settings), plain(build_settings(algo=settings.algo))
    return [(k, ran.get(k), default.get(k)) for k in sorted(set(ran) | set(default)) if ran.get(k) != default.get(k)]


def status(history: Sequence[Mapping[str, Any]], summary: Mapping[str, Any] | None, num_steps: int) -> str:
    """Finished, interrupted, or running (or killed) at the last logged step."""
    last = history[-1]["step"] if history else 0
    if summary is not None and summary.get("interrupted"):
        return f"interrupted at step {summary['steps']} of {num_steps}"
    if summary is not None and summary.get("after") is not None:
        return f"finished: {summary['steps']} of {num_steps} steps"
    return f"running, or stopped without a summary: step {last} of {num_steps} logged"


def metric_rows(history: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, float, float, float, float]]:
    """(key, points, first, last, min, max) of every curve `trainer show` draws, in panel order."""
    rows = []
    for panel in PANELS:
        for key in curves(panel, history):
            values = [float(r[key]) for r in history if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
            if values and key not in [row[0] for row in rows]:
                rows.append((key, len(values), values[0], values[-1], min(values), max(values)))
    return rows


def metrics_table(history: Sequence[Mapping[str, Any]]) -> Table:
    table = Table(title="curves (plots/*.png)", title_justify="left")
    table.add_column("metric", overflow="fold", min_width=20)
    for name in ("points", "first", "last", "min", "max"):
        table.add_column(name, justify="right")
    for key, points, *values in metric_rows(history):
        table.add_row(key, str(points), *(f"{v:.3g}" for v in values))
    return table


def settings_table(changed: Sequence[tuple[str, Any, Any]]) -> Table:
    table = Table(title="settings that differ from the defaults", title_justify="left")
    for name in ("setting", "this run", "default"):
        table.add_column(name, overflow="fold")
    for key, value, default in changed:
        table.add_row(key, json.dumps(value), json.dumps(default))
    return table


def correctness_function(settings: RunSettings) -> str | None:
    """The task's correctness reward (the share audit leaves it out), or None if the task cannot
    be built here (its data elsewhere)."""
    try:
        return settings.task.build().correct
    except Exception:  # noqa: BLE001 - any failure to read the task's data: the audit then names every share
        return None


def audit_warnings(history: Sequence[Mapping[str, Any]], settings: RunSettings,
                   summary: Mapping[str, Any] | None) -> list[str]:
    """One line per audit that tripped in the logged steps (its first warning, how often, the
    worst value) and per probe finding (summary.json's, once the run has ended)."""
    audit = settings.reward_audit
    if not audit.enabled:
        return []
    limits, correct = audit.limits(), correctness_function(settings)
    first: dict[str, tuple[int, Any]] = {}
    count: dict[str, int] = {}
    worst: dict[str, float] = {}
    for record in history:
        for trip in trips(record, limits, correctness=correct):
            first.setdefault(trip.key, (record["step"], trip))
            count[trip.key] = count.get(trip.key, 0) + 1
            worst[trip.key] = max(worst.get(trip.key, trip.value), trip.value)
    lines = [f"{trip.message(step)} [{count[key]} logged steps, worst {worst[key]:.2f}]"
             for key, (step, trip) in first.items()]
    probe = ((summary or {}).get("reward_audit") or {}).get("probe") or {}
    for name, kinds in probe.get("flagged", {}).items():
        paid = ", ".join(f"{kind} {probe['mean'][name][kind]:.2f}" for kind in kinds)
        lines.append(f"reward audit probe: {name!r} pays adversarial completions (mean score): {paid}")
    for name, error in probe.get("failed", {}).items():
        lines.append(f"reward audit probe: {name!r} failed on an adversarial completion: {error}")
    return lines


def settings_or_reason(load: Any) -> tuple[RunSettings | None, str | None]:
    """(settings, None), or (None, why they cannot be read here) for a run whose settings no
    longer build (e.g. its model folder is on another machine)."""
    try:
        return load(), None
    except (ConfigError, OSError) as e:
        return None, str(e)


def sft_line(records: Sequence[Mapping[str, Any]]) -> str:
    """One line on the run's supervised warm start (its sft_metrics.jsonl): steps, loss, rows a step, padding."""
    first, last = records[0], records[-1]
    rows = sum(r["rows"] for r in records) / len(records)
    padding = sum(r["padding_frac"] for r in records) / len(records)
    return (f"supervised warm start: {last['step']} steps, loss {first['loss']:.3f} -> {last['loss']:.3f}, "
            f"{rows:.1f} rows of {last['row_tokens']:.0f} tokens a step ({padding:.0%} padding)")
