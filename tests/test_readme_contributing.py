"""The contributing guide's steps (docs/contributing-an-algorithm.md) work as written.

A copy of the workspace, without the real packages/algo-rloo, gets the RLOO
package made from the guide's own text (the folder of step 1, the pyproject.toml of step 2, the __init__.py of
step 3, the two edits of step 4); then `uv lock` and `uv run trainer algos`
run in the copy, as a contributor would run them.
"""

import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from host import need_uv

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
IGNORED = shutil.ignore_patterns(".venv", ".git", "runs", "__pycache__", ".pytest_cache", "*.egg-info")


def contributing_section() -> str:
    """The guide, from its title on (the README links it: see tests/test_docs_links.py)."""
    guide = (ROOT / "docs" / "contributing-an-algorithm.md").read_text()
    return guide[guide.index("# Contributing an algorithm") :]


def one(pattern: str, text: str) -> re.Match:
    matches = list(re.finditer(pattern, text, flags=re.S))
    assert len(matches) == 1, f"the contributing guide should hold exactly one match of {pattern!r}"
    return matches[0]


def uv(workspace: Path, *args: str) -> subprocess.CompletedProcess:
    """`uv ARGS` in `workspace`, offline first (fast, from uv's cache); a cold cache (a fresh
    machine: "the network was disabled") is filled from the registry, as a contributor's would be."""
    need_uv()
    executable = shutil.which("uv")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "UV_OFFLINE")}

    def run(*extra: str) -> subprocess.CompletedProcess:
        command = [executable, *args[:1], *extra, *args[1:]]
        return subprocess.run(command, cwd=workspace, env=env, capture_output=True, text=True, timeout=600)

    done = run("--offline")
    if done.returncode != 0 and "network was disabled" in done.stderr:
        done = run()
    return done


def test_the_contributing_steps_make_a_working_package(tmp_path):
    text = contributing_section()
    work = tmp_path / "workspace"
    shutil.copytree(ROOT, work, ignore=IGNORED)
    # The walk-through is how packages/algo-rloo was made: the copy starts without it.
    shutil.rmtree(work / "packages" / "algo-rloo")
    for manifest in (work / "pyproject.toml", work / "apps" / "trainer" / "pyproject.toml"):
        lines = manifest.read_text().splitlines(keepends=True)
        manifest.write_text("".join(line for line in lines if "algo-rloo" not in line))

    # 1. the folder; 2. its pyproject.toml; 3. its __init__.py, each from the guide's own words and blocks
    folder = work / one(r"Make the folder `([^`]+)`", text).group(1)
    folder.mkdir(parents=True)
    pyproject = work / one(r"`([^`]+/pyproject\.toml)` declares", text).group(1)
    pyproject.write_text(textwrap.dedent(one(r"```toml\n(.*?)```", text).group(1)))  # blocks indented in a list
    (folder / "__init__.py").write_text(textwrap.dedent(one(r"```python\n(.*?)```", text).group(1)))

    # 4. the two edits of the trainer's pyproject.toml
    step4 = one(r"\n4\. (.*?)\n5\. ", text).group(1)
    trainer = work / one(r"In `([^`]+)`", step4).group(1)
    dependency = one(r'add `("[^"]+")` to `dependencies`', step4).group(1)
    source = one(r"`([^`]+ = \{ workspace = true \})` to `\[tool\.uv\.sources\]`", step4).group(1)
    toml = trainer.read_text()
    toml = toml.replace("dependencies = [\n", f"dependencies = [\n    {dependency},\n", 1)
    toml = toml.replace("[tool.uv.sources]\n", f"[tool.uv.sources]\n{source}\n", 1)
    trainer.write_text(toml)
    assert "uv lock" in step4

    locked = uv(work, "lock")
    assert locked.returncode == 0, locked.stderr[-3000:]
    assert 'name = "algo-rloo"' in (work / "uv.lock").read_text()

    # 5. `uv run trainer algos` lists it, with its distribution
    listed = uv(work, "run", "--locked", "trainer", "algos")
    assert listed.returncode == 0, listed.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines() if line.strip()}
    assert "rloo" in rows, listed.stdout + listed.stderr[-2000:]
    assert rows["rloo"][1] == "algo-rloo"
    assert {"grpo", "dr_grpo", "dapo", "rloo"} <= set(rows)
