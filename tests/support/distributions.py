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
