"""A third-party distribution laid out as an installer would (its module and its dist-info with
entry points), and a Python process that sees it: how the plugin tests install a package."""

import os
import subprocess
import sys
from pathlib import Path


def install(site: Path, name: str, source: str, group: str, entry_points: str, version: str = "0.1.0") -> None:
    """Module `name` holding `source`, and `name`'s dist-info declaring `entry_points` in `group`."""
    (site / f"{name}.py").write_text(source)
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry_points}")


def run_with(site: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python *args` in a fresh process with `site` first on its path."""
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, *args], env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=timeout)


def engine_installed(site: Path, monkeypatch, name: str, source: str, entry_point: str):
    """A generator for a fixture: module `name` (holding `source`) installed in `site` with
    `entry_point` in the group `rl_core.engines`, and a fresh process registry that knows what
    the process's knows but has not read the entry points yet, so the first unknown name makes it
    read them all, the new distribution's included (as a run's would)."""
    from rl_core import registry

    install(site, name, source, "rl_core.engines", entry_point)
    monkeypatch.syspath_prepend(str(site))
    process = registry.registry
    process.names(registry.ENGINE)  # every provider loaded
    fresh = registry.Registry()
    for category, entries in process._entries.items():
        fresh._entries[category].update(entries)
    fresh._builtins_loaded = True
    monkeypatch.setattr(registry, "registry", fresh)
    yield
    sys.modules.pop(name, None)
