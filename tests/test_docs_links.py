"""The documentation's links resolve: every relative link in README.md, docs/ and the package
READMEs names a file of the repository, and every #anchor a heading of its target. The docs cite
nothing outside the repository."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


def documents() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for pattern in ("packages/*/README.md", "apps/*/README.md", "benchmarks/README.md"):
        found += sorted(ROOT.glob(pattern))
    return found


def prose(path: Path) -> str:
    """The file's text outside fenced code blocks."""
    keep, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            keep.append(line)
    return "\n".join(keep)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    slugs = set()
    for line in prose(path).splitlines():
        heading = re.match(r"^#{1,6} (.*)", line)
        if heading:
            text = heading.group(1).strip().replace("`", "").lower()
            slugs.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return slugs


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path)) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(path):
    broken = []
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists() or ROOT not in (resolved, *resolved.parents):
            broken.append(f"{target}: no such file in the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_cites_nothing_outside_the_repository(path):
    text = path.read_text()
    # the development notes beside the checkout (spelled in parts so this file names none of them)
    for name in ("DESIGN" + ".md", "STYLE" + ".md", "../" + "shared"):
        assert name not in text, f"{path.relative_to(ROOT)} mentions {name}"


def test_every_guide_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    guides = [p for p in (ROOT / "docs").rglob("*.md") if p.parent.name != "results" or p.name == "README.md"]
    guides = [p for p in guides if p != ROOT / "docs" / "index.md"]  # the site's front page (mkdocs.yml)
    missing = [str(p.relative_to(ROOT)) for p in guides if str(p.relative_to(ROOT)) not in readme]
    assert not missing, f"guides the README does not link: {missing}"
