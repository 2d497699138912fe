"""The helpers of scripts/tpu-tests.sh: pytest's arguments for one process on a host installed
from wheels, and the summary of its junit report.

    python3 scripts/tpu_tests.py args              pytest's options, one a line
    python3 scripts/tpu_tests.py summary JUNIT OUT  OUT (Markdown): the tally, skips by reason, failures

Standard library only: the TPU host has pytest but not the project's dev tools.
"""

from __future__ import annotations

import sys
import tomllib
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HOST_WARNINGS = [
    # jax on a TPU v5e host without transparent hugepages, at every import: the host's setting, not ours
    "ignore:Transparent hugepages are not enabled:UserWarning",
    # a host's hypothesis plugin imports libcst, which builds a mypy_extensions.TypedDict
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning",
]
"""Warnings of the host's own packages, ignored by their exact message (pytest -W, which takes the
message literally): `filterwarnings = error` still holds for everything else, the project's code
included."""

XDIST_OPTIONS = ("--numprocesses", "--maxprocesses", "--dist", "--no-loadscope-reorder", "-n")
"""pyproject's pytest-xdist options: one process holds the chip, and a host may not have xdist
(its options would then be unknown to pytest)."""


def pytest_args() -> list[str]:
    """pyproject's addopts without pytest-xdist's (its marker expression, the fast tier, kept),
    then the host's warning filters; the caller passes `-o addopts=` so these replace them."""
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    kept = [a for a in addopts if not a.startswith(XDIST_OPTIONS)]
    return [*kept, "-p", "no:xdist", *(f"-W{w}" for w in HOST_WARNINGS)]


def summary(junit: Path) -> str:
    """The report's tally, its skips grouped by reason (most first) and its failures, in Markdown."""
    cases = ET.parse(junit).getroot().iter("testcase")
    passed, skipped, failed = [], defaultdict(list), []
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = next((c for c in case if c.tag in ("skipped", "failure", "error")), None)
        if outcome is None:
            passed.append(name)
        elif outcome.tag == "skipped":
            skipped[_reason(outcome.get("message", ""))].append(name)
        else:
            failed.append((name, outcome.tag, (outcome.get("message") or "").splitlines()[:1]))
    lines = [f"passed {len(passed)}, skipped {sum(map(len, skipped.values()))}, failed {len(failed)}", ""]
    if skipped:
        lines += ["## Skipped, by reason", ""]
        for reason, names in sorted(skipped.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"- {len(names)}: {reason} (e.g. `{names[0]}`)")
        lines.append("")
    if failed:
        lines += ["## Failed", ""]
        lines += [f"- `{name}` ({tag}): {message[0] if message else ''}" for name, tag, message in failed]
        lines.append("")
    return "\n".join(lines)


def _reason(message: str) -> str:
    """A skip's reason without pytest's prefix."""
    return message.removeprefix("Skipped: ").strip() or "(no reason given)"


def main(argv: list[str]) -> int:
    if argv[:1] == ["args"]:
        print("\n".join(pytest_args()))
        return 0
    if argv[:1] == ["summary"] and len(argv) == 3:
        text = summary(Path(argv[1]))
        Path(argv[2]).write_text(text)
        print(text)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
