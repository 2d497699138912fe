"""Looking a name up in a table of factories, with the error every table of the package gives."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


def lookup(table: Mapping[str, T], name: str, what: str) -> T:
    """``table[name]``; an unknown name raises a ValueError naming `what`, the known names and the
    closest one."""
    if name in table:
        return table[name]
    close = difflib.get_close_matches(str(name), table, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown {what} {name!r}; known: {', '.join(table)}.{hint}")
