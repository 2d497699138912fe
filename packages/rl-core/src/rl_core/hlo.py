"""Collectives in compiled XLA programs, read from their HLO text.

Used by tests (and anyone checking a layout) to state properties of compiled
programs: e.g. the paged engine's decode step gathers no weight.
`collectives(text)` lists every cross-device collective with its result shape;
`count(text)` tallies them by kind.
"""

from __future__ import annotations

import collections
import re
from typing import NamedTuple

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")

# e.g. "  %all-gather.3 = f32[8,64]{1,0} all-gather(f32[1,64]{1,0} %p), channel_id=1, ..."
# (async pairs "all-gather-start"/"-done" count once, at the start)
_OP = re.compile(r"=\s*(?P<result>[^=\n]*?)\s+(?P<kind>" + "|".join(KINDS) + r")(?:-start)?\(")


class Collective(NamedTuple):
    kind: str
    result: str  # the result type, e.g. "f32[8,64]{1,0}"

    @property
    def elements(self) -> int:
        dims = re.search(r"\[([^\]]*)\]", self.result)
        if dims is None or not dims.group(1):
            return 1
        n = 1
        for d in dims.group(1).split(","):
            n *= int(d)
        return n


def collectives(hlo_text: str) -> list[Collective]:
    """Every collective op of a compiled program's HLO text (`compiled.as_text()`)."""
    return [Collective(m.group("kind"), m.group("result")) for m in _OP.finditer(hlo_text)]


def count(hlo_text: str) -> dict[str, int]:
    """Collective ops by kind (kinds absent from the program are absent here)."""
    return dict(collections.Counter(c.kind for c in collectives(hlo_text)))
