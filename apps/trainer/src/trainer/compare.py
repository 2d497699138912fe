"""`trainer compare`: every variant from the same base policy, seed, prompts and budget."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rl_core import registry

from trainer.report import write_report
from trainer.run import train_run
from trainer.settings import build_settings


def compare(
    algos: Sequence[str],
    *,
    output: Path,
    config_file: str | None = None,
    overrides: Sequence[str] = (),
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> tuple[str, list[dict]]:
    """Run each algorithm in `output/<algo>` and write the report into `output`.

    Variant folders of an earlier comparison in `output` are replaced; the
    cached base policy is reused when its settings match.
    """
    algos = list(algos) or registry.registry.names("algorithm")
    all_settings = [build_settings(algo=a, config_file=config_file, overrides=overrides) for a in algos]
    start = time.perf_counter()
    summaries, histories = [], {}
    for settings in all_settings:
        run_dir = output / settings.algo
        # one cached base policy for all variants: same weights, one warm start
        summary = train_run(settings, run_dir, progress=progress, log=log, base_cache=output, overwrite=True)
        summaries.append(summary)
        histories[settings.algo] = _history(run_dir)
    table = write_report(output, summaries, histories)
    log(f"compare: {len(algos)} variants in {time.perf_counter() - start:.1f} s; report in {output}")
    return table, summaries


def _history(run_dir: Path) -> list[dict]:
    """The run's metrics, starting with its base-policy evaluation as step 0."""
    before = json.loads((run_dir / "eval_before.json").read_text())
    path = run_dir / "metrics.jsonl"
    return [{"step": 0, **before}] + [json.loads(line) for line in path.read_text().splitlines() if line]
