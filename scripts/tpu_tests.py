"""The helpers of scripts/tpu-tests.sh: pytest's arguments for one process on a host installed
from wheels, and the summary of its junit report.

    python3 scripts/tpu_tests.py args              pytest's options, one a line
    python3 scripts/tpu_tests.py summary JUNIT OUT  OUT (Markdown): the tally, skips by reason, failures
    python3 scripts/tpu_tests.py shard I N         the test files of shard I of N (1..N), one a line
    python3 scripts/tpu_tests.py merge OUT REPORT...  one summary of several reports (the shards' calls,
                                                      oldest first: a test's last result counts)
    python3 scripts/tpu_tests.py record OUT REPORT... the reports' outcomes, a test a line, for a results page
    python3 scripts/tpu_tests.py deselect REPORT...   `--deselect=NODE_ID` for each test the reports hold
                                                      (missing reports are none): a cut run resumes

A report is pytest's junit XML or a file `record` wrote.

A chip lent for minutes at a time runs the fast tier in shards (each test compiles its programs for
the TPU: seconds a test), one a call, and `merge` makes the shards' reports one tally.

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


def test_files(tests: Path = ROOT / "tests") -> dict[Path, int]:
    """Each test file under `tests` and its count of test functions (`def test_`, as written)."""
    return {path: path.read_text().count("def test_") for path in sorted(tests.rglob("test_*.py"))}


def shard(index: int, count: int, files: dict[Path, int]) -> list[Path]:
    """The files of shard `index` (1..count): the files, most tests first, each to the shard with
    the fewest tests so far (ties to the lowest), so the shards hold about as many tests each."""
    if not 1 <= index <= count:
        raise ValueError(f"shard {index} of {count}: the shard is 1..{count}")
    loads, out = [0] * count, [[] for _ in range(count)]
    for path, n in sorted(files.items(), key=lambda kv: (-kv[1], str(kv[0]))):
        k = loads.index(min(loads))
        loads[k] += n
        out[k].append(path)
    return sorted(out[index - 1])


Outcome = tuple[str, str]
"""A test's result in a report: ("passed" | "skipped" | "failure" | "error", the reason or message's first line)."""


def node_id(classname: str, name: str, root: Path = ROOT) -> str:
    """pytest's node id of a junit test case (`tests/a/test_b.py::Class::test_c[x]`): the longest
    dotted prefix of its class name that is a file under `root`; the dotted name where none is."""
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        if (root / Path(*parts[:i])).with_suffix(".py").is_file():
            return "::".join(["/".join(parts[:i]) + ".py", *parts[i:], name])
    return f"{classname}::{name}"


def outcomes(report: Path) -> dict[str, Outcome]:
    """Each test of a report and its outcome. A report is pytest's junit XML or a file that
    `record` wrote (`OUTCOME NODE_ID  # DETAIL` a line: the record a results page keeps, since a
    host's scratch files do not outlive it). A cut run's entry without a class name is left out."""
    if report.suffix != ".xml":
        cases = {}
        for line in report.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                head, _, detail = line.partition("  # ")
                tag, _, node = head.partition(" ")
                cases[node.strip()] = (tag, detail.strip())
        return cases
    cases = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        if not case.get("classname") or not case.get("name"):
            continue
        result = next((c for c in case if c.tag in ("skipped", "failure", "error")), None)
        if result is None:
            outcome = ("passed", "")
        else:  # a skip's reason, or a failure's first line
            message = result.get("message") or ""
            outcome = (result.tag, _reason(message) if result.tag == "skipped" else (message.splitlines() or [""])[0])
        cases[node_id(case.get("classname"), case.get("name"))] = outcome
    return cases


def latest(*reports: Path) -> dict[str, Outcome]:
    """The reports' tests, each as the last report has it (reports in the order they ran: a test
    re-run after a fix, on a later call or commit, stands for that test)."""
    return {node: outcome for report in reports for node, outcome in outcomes(report).items()}


def record(*reports: Path) -> str:
    """The reports' outcomes as one text, a test a line, sorted: the file a results page commits."""
    return "".join(f"{tag} {node}{'  # ' + detail if detail else ''}\n"
                   for node, (tag, detail) in sorted(latest(*reports).items()))


def summary(*reports: Path) -> str:
    """The reports' tally, their skips grouped by reason (most first) and failures, in Markdown. A test
    in several reports counts once, as the last report has it."""
    passed, skipped, failed = [], defaultdict(list), []
    for name, (tag, detail) in sorted(latest(*reports).items()):
        if tag == "passed":
            passed.append(name)
        elif tag == "skipped":
            skipped[detail or "(no reason given)"].append(name)
        else:
            failed.append((name, tag, detail))
    lines = [f"passed {len(passed)}, skipped {sum(map(len, skipped.values()))}, failed {len(failed)}", ""]
    if skipped:
        lines += ["## Skipped, by reason", ""]
        for reason, names in sorted(skipped.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"- {len(names)}: {reason} (e.g. `{names[0]}`)")
        lines.append("")
    if failed:
        lines += ["## Failed", ""]
        lines += [f"- `{name}` ({tag}): {detail}" for name, tag, detail in failed]
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
    if argv[:1] == ["merge"] and len(argv) >= 3:
        if Path(argv[1]).suffix == ".xml" or Path(argv[1]) in map(Path, argv[2:]):
            print(f"merge OUT REPORT...: OUT {argv[1]} looks like a report; name the summary to write first "
                  "(e.g. all.md)", file=sys.stderr)
            return 2
        text = summary(*map(Path, argv[2:]))
        Path(argv[1]).write_text(text)
        print(text)
        return 0
    if argv[:1] == ["record"] and len(argv) >= 3:
        Path(argv[1]).write_text(record(*map(Path, argv[2:])))
        return 0
    if argv[:1] == ["deselect"]:
        print("\n".join(f"--deselect={node}" for node in latest(*(Path(r) for r in argv[1:] if Path(r).is_file()))))
        return 0
    if argv[:1] == ["shard"] and len(argv) == 3:
        print("\n".join(str(p.relative_to(ROOT)) for p in shard(int(argv[1]), int(argv[2]), test_files())))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
