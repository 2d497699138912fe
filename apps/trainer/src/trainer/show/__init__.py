"""`trainer show RUN` and `trainer samples RUN`: one run's records, viewed (a finished run, or one
still running; a local folder or a URL). The records are read through the run's layout
(rl_core.run.records); the plots go to the run folder's plots/ (at a URL: uploaded there).

curves: the PNG panels; report: the terminal summary's parts; select: which samples."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rl_core.run import open_records, PLOTS, read_jsonl, RunRecords, samples_table, SFT_METRICS, storage

from trainer.run import settings_of_run
from trainer.show import report
from trainer.show.curves import plot_run, with_evaluations
from trainer.show.select import SampleFilter, best_and_worst, chosen_steps, parse_steps, select

__all__ = ["SampleFilter", "parse_steps", "select", "show_run", "show_samples"]


def show_run(location: str | Path, *, steps: tuple[tuple[int, int], ...] = (), count: int = 2,
             console: Console | None = None, plots: bool = True) -> list[str]:
    """Print the run's summary to `console` and write its plots (unless not `plots`); returns the
    plots' paths (URLs for a run at a URL)."""
    console = console or Console()
    with open_records(location) as records:
        history, summary, samples = records.metrics(), records.summary(), records.samples()
        settings, why = report.settings_or_reason(lambda: settings_of_run(records.folder))
        name = str(location).rstrip("/")
        num_steps = settings.training.num_steps if settings else (summary or {}).get("steps", 0)
        console.print(f"[bold]{name}[/bold]: {settings.algo if settings else '?'}, "
                      f"{report.status(history, summary, num_steps)}", highlight=False)
        before, after = records.eval_before(), (summary or {}).get("after")
        if before and "eval/accuracy" in before:
            shown = f"{after['eval/accuracy']:.3f}" if after else "(at the end)"
            console.print(f"held-out accuracy: before RL {before['eval/accuracy']:.3f}, after {shown}")
        sft = read_jsonl(records.folder / SFT_METRICS)[0] if (records.folder / SFT_METRICS).exists() else []
        if sft:  # the run performed its warm start (a base policy taken from a cache has no records)
            console.print(report.sft_line(sft), highlight=False)
        if settings is None:
            console.print(f"settings: cannot be read here ({why})", highlight=False)
        else:
            changed = report.changed_settings(settings)
            console.print(report.settings_table(changed) if changed else "settings: all defaults")
        if history:
            console.print(report.metrics_table(history))
        warnings = report.audit_warnings(history, settings, summary) if settings else []
        console.print("reward audits: " + ("no warning" if not warnings else f"{len(warnings)} warning(s)"))
        for line in warnings:
            console.print(f"  {line}", highlight=False, markup=False)
        for step in chosen_steps(samples, steps):
            best, worst = best_and_worst([s for s in samples if s["step"] == step], count)
            console.print(samples_table(best + worst, title=f"step {step}: best {len(best)} and worst {len(worst)} samples"))
        if not plots:
            return []
        written = _plots(records, location, history, before, summary, title=f"{name} ({settings.algo if settings else '?'})")
        console.print("plots: " + ", ".join(written), highlight=False)
        return written


def _plots(records: RunRecords, location: str | Path, history: Sequence[dict[str, Any]], before: Any,
           summary: Any, *, title: str) -> list[str]:
    """Write the PNGs into the run folder's plots/ (a URL's: uploaded there); their paths."""
    after = (summary or {}).get("after")
    steps = (summary or {}).get("steps")
    written = plot_run(with_evaluations(history, before, after, steps), records.folder / PLOTS, title=title)
    if not storage.is_url(location):
        return [str(p) for p in written]
    url = storage.child(location, PLOTS)
    storage.replace_folder(records.folder / PLOTS, url)
    return [storage.child(url, p.name) for p in written]


def show_samples(location: str | Path, where: SampleFilter, *, limit: int | None, output: Path | None,
                 console: Console | None = None, as_json: bool = False) -> list[dict[str, Any]]:
    """The samples of the run at `location` that match `where`: written to `output` as JSONL, or
    printed (the first `limit` as a table, or every one as JSONL with `as_json`)."""
    console = console or Console()
    with open_records(location) as records:
        matches = select(records.samples(), where)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text("".join(json.dumps(s) + "\n" for s in matches), encoding="utf-8")
        console.print(f"{len(matches)} matching samples written to {output}", highlight=False)
    elif as_json:
        for sample in matches:
            console.out(json.dumps(sample), highlight=False)
    else:
        shown = matches if limit is None else matches[:limit]
        if shown:
            console.print(samples_table(shown))
        more = f" (the first {len(shown)} shown; --limit N shows more)" if len(shown) < len(matches) else ""
        console.print(f"{len(matches)} matching samples{more}", highlight=False)
    return matches
