"""What several commands' arguments share."""

from __future__ import annotations

from pathlib import Path

from rl_core.run import is_url

DEFAULT_COMPARE_DIR = Path("runs/compare")
def location(text: str) -> Path | str:
    """A folder argument: a local path, or a URL kept as written (gs://bucket/run; a Path would fold its //)."""
    return text if is_url(text) else Path(text)


SETTINGS_HINT = "settings: `trainer config [--algo NAME]` lists every key=value setting with its type, default and description"
