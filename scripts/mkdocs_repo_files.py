"""An mkdocs hook (mkdocs.yml `hooks:`): the repository files the guides link to outside docs/ (the
package READMEs, examples/, benchmarks/) become part of the site under `repo/`, and the links to
them are rewritten to match, so that every link of the site resolves as it does in the repository.

A linked folder is its README.md, or a generated list of its files. Links are found as
tests/test_docs_links.py finds them: `[text](target)` outside fenced code, not URLs.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

LINK = re.compile(r"(\[[^\]]*\]\()([^)\s]+)(\))")
FENCE = re.compile(r"^\s*```")
SITE_FOLDER = "repo"


def _root(config) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def _repo_path(src_uri: str, docs: str) -> str:
    """The repository path of a site file (`algorithms.md` -> `docs/algorithms.md`)."""
    head, _, rest = src_uri.partition("/")
    return rest if head == SITE_FOLDER else posixpath.join(docs, src_uri)


def _site_path(repo_path: str, docs: str, root: Path) -> str:
    """Where a repository path is in the site: docs/ as it is, everything else under repo/."""
    if repo_path == docs or repo_path.startswith(docs + "/"):
        return repo_path[len(docs) + 1:]
    if (root / repo_path).is_dir():
        repo_path = posixpath.join(repo_path, "README.md")
    return posixpath.join(SITE_FOLDER, repo_path)


def _outside_links(text: str):
    """(match, target) for each link outside fenced code, line by line (so a rewrite keeps the rest)."""
    fenced = False
    for line in text.splitlines(keepends=True):
        if FENCE.match(line):
            fenced = not fenced
        yield line, ([] if fenced else [m for m in LINK.finditer(line) if not re.match(r"^[a-z][a-z0-9+.-]*:|#", m[2])])


def _resolve(page_repo_path: str, target: str) -> str:
    file = target.partition("#")[0]
    return posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), file))


def _listing(folder: str, root: Path) -> str:
    names = sorted(p.name for p in (root / folder).iterdir() if p.is_file())
    return f"# {folder}/\n\n" + "".join(f"- [{name}]({name})\n" for name in names)


def on_files(files: Files, config) -> Files:
    root, docs = _root(config), Path(config["docs_dir"]).resolve().relative_to(_root(config)).as_posix()
    todo = [f for f in files if f.src_uri.endswith(".md")]
    added: set[str] = set()
    while todo:
        page = todo.pop()
        page_path = _repo_path(page.src_uri, docs)
        text = (root / page_path).read_text() if page.abs_src_path else page.content_string
        for _, matches in _outside_links(text):
            for m in matches:
                target = _resolve(page_path, m[2])
                site = _site_path(target, docs, root)
                if not site.startswith(SITE_FOLDER + "/") or site in added or not (root / target).exists():
                    continue  # a guide (mkdocs checks it), one already added, or a broken link (its test says)
                added.add(site)
                if (root / target).is_dir() and not (root / target / "README.md").exists():
                    new = File.generated(config, site, content=_listing(target, root))
                    for child in sorted((root / target).iterdir()):
                        child_site = posixpath.join(posixpath.dirname(site), child.name)
                        if child.is_file() and child_site not in added:
                            added.add(child_site)
                            files.append(File.generated(config, child_site, abs_src_path=str(child)))
                else:
                    source = root / target / "README.md" if (root / target).is_dir() else root / target
                    new = File.generated(config, site, abs_src_path=str(source))
                files.append(new)
                if site.endswith(".md"):
                    todo.append(new)
    return files


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    root, docs = _root(config), Path(config["docs_dir"]).resolve().relative_to(_root(config)).as_posix()
    page_path = _repo_path(page.file.src_uri, docs)
    out = []
    for line, matches in _outside_links(markdown):
        for m in reversed(matches):  # from the right: earlier offsets stay valid
            target = _resolve(page_path, m[2])
            inside = target == docs or target.startswith(docs + "/")
            if not (root / target).exists() or (inside and page_path.startswith(docs + "/")):
                continue  # a guide's link to a guide: mkdocs resolves it as it is
            anchor = m[2].partition("#")[2]
            new = posixpath.relpath(_site_path(target, docs, root), posixpath.dirname(page.file.src_uri) or ".")
            new += f"#{anchor}" if anchor else ""
            line = line[: m.start(2)] + new + line[m.end(2):]
        out.append(line)
    return "".join(out)
