"""`trainer bench --baseline FILE`: this run's phases against a saved run's, as ratios.

A phase is flagged when it takes more than `tolerance` (default 10%) longer than
in the baseline. Phases that are a small share of the baseline's step (reward,
host work: a fraction of a millisecond) are shown but not flagged, since their
noise on a shared machine is larger than any change worth a flag. Utilisation
ratios are shown beside the time ratios: they divide out the matmul peak each
run measured, so they stay meaningful when the machine's speed itself moved.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

from rl_core import ConfigError

TOLERANCE = 0.10
"""A phase more than this much slower than the baseline is flagged."""
MIN_SHARE = 0.05
"""Phases under this share of the baseline's step time are compared but never flagged."""
PHASES = ("rollout", "reward", "logprob", "update", "critic_update", "other", "step")  # critic_update: PPO
STANDALONE = ("prefill", "decode")


class PhaseRatio(NamedTuple):
    """One phase of the current run against the baseline."""

    phase: str
    baseline_seconds: float
    seconds: float
    time_ratio: float  # seconds / baseline_seconds: > 1 is slower
    mfu_ratio: float  # mfu / baseline mfu: < 1 is less of the peak (nan where no FLOPs are counted)
    flagged: bool


def load_baseline(path: str | Path) -> dict[str, Any]:
    """A saved `trainer bench --output` JSON, checked for the fields the comparison reads."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"--baseline {path}: cannot read it ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"--baseline {path}: not a trainer bench JSON file ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("phases"), dict) or "step" not in data["phases"]:
        raise ConfigError(f"--baseline {path}: not a trainer bench JSON file (no phases.step); "
                          "write one with `trainer bench --output FILE`")
    return data


def compare(current: dict[str, Any], baseline: dict[str, Any], tolerance: float = TOLERANCE) -> list[PhaseRatio]:
    """Each phase (and the standalone prefill and decode) of `current` against `baseline`."""
    step = baseline["phases"]["step"]["seconds"]
    rows = []
    for name in PHASES + STANDALONE:
        now = current["phases"].get(name) if name in PHASES else current.get(name)
        then = baseline["phases"].get(name) if name in PHASES else baseline.get(name)
        if not now or not then or then["seconds"] <= 0:
            continue  # absent in one of them (an older file), or a phase that did not run
        time_ratio = now["seconds"] / then["seconds"]
        mfu_ratio = now["mfu"] / then["mfu"] if then.get("mfu") else math.nan
        big_enough = name in STANDALONE or then["seconds"] >= MIN_SHARE * step
        rows.append(PhaseRatio(name, then["seconds"], now["seconds"], time_ratio, mfu_ratio,
                               big_enough and time_ratio > 1 + tolerance))
    return rows


def differences(current: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """What makes the two runs not the same benchmark (preset, algorithm, model, batch)."""
    out = []
    for key in ("preset", "algo", "model", "batch", "lora"):
        if current.get(key) != baseline.get(key):
            out.append(f"{key}: baseline {baseline.get(key)!r}, now {current.get(key)!r}")
    return out


def print_comparison(rows: list[PhaseRatio], baseline_path: str | Path, notes: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"against the baseline {baseline_path}")
    for column in ("phase", "baseline s", "now s", "time ratio", "MFU ratio", ""):
        table.add_column(column, justify="left" if column in ("phase", "") else "right")
    for r in rows:
        mfu = "" if math.isnan(r.mfu_ratio) else f"{r.mfu_ratio:.2f}"
        mark = f"SLOWER by {r.time_ratio - 1:.0%}" if r.flagged else ""
        table.add_row(r.phase, f"{r.baseline_seconds:.4f}", f"{r.seconds:.4f}", f"{r.time_ratio:.2f}", mfu, mark,
                      style="bold red" if r.flagged else None)
    console = Console()
    console.print(table)
    for note in notes:
        console.print(f"not the same benchmark: {note}")
    flagged = [r.phase for r in rows if r.flagged]
    console.print(
        f"{len(flagged)} phase(s) more than {TOLERANCE:.0%} slower than the baseline: {', '.join(flagged)}"
        if flagged else f"no phase more than {TOLERANCE:.0%} slower than the baseline"
    )
