"""The documentation site builds from docs/ with mkdocs in strict mode (mkdocs.yml): every page in
the navigation exists, and every link and anchor resolves, the links to repository files outside
docs/ included (scripts/mkdocs_repo_files.py adds those files to the site)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from host import uv_missing

REPO = Path(__file__).resolve().parents[1]


def nav_pages(nav) -> list[str]:
    pages = []
    for entry in nav:
        for value in entry.values():
            pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_guide_is_in_the_navigation():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    pages = set(nav_pages(config["nav"]))
    guides = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    dated = {g for g in guides if g.startswith("results/") and g != "results/README.md"}
    assert guides - dated == pages


def test_the_site_builds_strictly(tmp_path):
    if shutil.which("mkdocs") is None and not (Path(sys.executable).parent / "mkdocs").exists():
        if uv_missing():  # a host installed from wheels: scripts/wheelhouse.py build --leave-out mkdocs
            pytest.skip("mkdocs is left out of this host's wheelhouse (a host installed from wheels)")
        raise AssertionError("mkdocs is missing: it is in the dev group (uv sync --locked)")
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "concepts" / "architecture" / "index.html").exists()
    # links to files outside docs/ resolve in the site too (mkdocs.yml's hook adds them under repo/;
    # strict mode fails on a link it cannot resolve): a package README, a folder, a source file
    site = tmp_path / "site"
    assert 'href="../repo/packages/algo-dppo/"' in (site / "algorithms" / "index.html").read_text()
    assert (site / "repo" / "packages" / "algo-dppo" / "index.html").exists()
    assert 'href="../../../algorithms/"' in (site / "repo" / "packages" / "algo-dr-grpo" / "index.html").read_text()
    assert 'href="sums.jsonl"' in (site / "repo" / "examples" / "bring-your-own-task" / "index.html").read_text()
    assert (site / "repo" / "examples" / "agents" / "multiply_agent.py").read_text() == \
        (REPO / "examples" / "agents" / "multiply_agent.py").read_text()
    assert "not found among documentation files" not in out.stderr
    assert "unrecognized relative link" not in out.stderr
