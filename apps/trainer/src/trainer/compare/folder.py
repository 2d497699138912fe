"""The comparison folder: what a new comparison may replace, checked before any training.

A comparison writes `report.md`, `results.json`, PNG plots and one folder per
variant (`<algo>/seed-<n>/`, each a run folder) beside the cached base policy.
A second comparison into the same folder refuses unless `overwrite`, and then
removes every earlier variant folder, so none is left from another
configuration. A `<algo>/` folder that holds a `trainer train` run is never
replaced, unless the earlier comparison's results.json names it as one of its
variants: otherwise that run is someone's work, not a comparison's output.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from trainer.run import RUN_FILES

REPORT_FILES = ("report.md", "results.json")
SEED_PREFIX = "seed-"


def seed_dir(output: Path, algo: str, seed: int) -> Path:
    return output / algo / f"{SEED_PREFIX}{seed}"


def is_variant_folder(path: Path) -> bool:
    """A folder a comparison wrote: it holds seed-<n>/ run folders and no run of its own."""
    return path.is_dir() and any(path.glob(f"{SEED_PREFIX}*")) and not holds_train_run(path)


def holds_train_run(path: Path) -> bool:
    return (path / "config.yaml").exists() or any((path / name).exists() for name in RUN_FILES)


def _variants_of_report(path: Path) -> set[str]:
    """The variant folders an earlier comparison's results.json names (also a one-seed layout's
    `<algo>/` run folders, from before comparisons had seeds)."""
    try:
        return {v["algo"] for v in json.loads(path.read_text())["variants"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def claim(output: Path, algos: Sequence[str], plots: Sequence[str], *, overwrite: bool) -> None:
    """Make `output` ready for a comparison of `algos`, or raise FileExistsError saying why not.

    The cached base policy and its evaluation (`base-policy-*`, `eval-base-*`)
    are kept: they are keyed by everything they depend on.
    """
    earlier_variants = _variants_of_report(output / "results.json")
    for algo in algos:
        if holds_train_run(output / algo) and algo not in earlier_variants:
            raise FileExistsError(
                f"{output / algo} holds a `trainer train` run, which a comparison never replaces; "
                "move it or choose another --output"
            )
    if not output.is_dir():
        return
    earlier = [output / name for name in (*REPORT_FILES, *plots) if (output / name).exists()]
    earlier += sorted(p for p in output.iterdir() if is_variant_folder(p) or (p.is_dir() and p.name in earlier_variants))
    if not earlier:
        return
    if not overwrite:
        shown = ", ".join(p.name for p in earlier[:6]) + (", ..." if len(earlier) > 6 else "")
        raise FileExistsError(
            f"{output} already holds a comparison ({shown}); pass --overwrite to replace it, "
            "or choose another --output"
        )
    for path in earlier:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
