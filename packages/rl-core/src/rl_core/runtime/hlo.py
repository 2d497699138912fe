"""The collectives of a compiled program, read from its HLO text.

What a mesh costs is in the compiled program: which collectives XLA put in, on
what shapes, how often. `collectives(compiled.as_text())` lists every
all-gather, all-reduce, reduce-scatter, all-to-all and collective-permute with
the bytes of its result per device and how many times it runs: an op inside a
`while` loop (a `lax.scan` over layers or micro-batches) counts once per trip
when XLA knows the trip count. Tests assert on these (no weight all-gather in a
decode step, activation all-reduces gone, bytes within a bound of FSDP's), and
`summary` totals them; `count` tallies the instructions by kind.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import NamedTuple

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "s4": 0.5, "u4": 0.5}
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.-]+) [^{]*\{\s*$")
_OP = re.compile(r"^\s*(?:ROOT )?%?[\w.-]+ = (.+?) (" + "|".join(KINDS) + r")(?:-start)?\(")
_ARRAY = re.compile(r"\b(pred|bf16|[subf]\d+)\[([\d,]*)\]")
_WHILE = re.compile(r"\bwhile\(.*?condition=%?([\w.-]+), body=%?([\w.-]+)")
_CALLS = re.compile(r"(?:calls|to_apply|branch_computations)=\{?%?([\w.%, -]+)\}?")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


class Collective(NamedTuple):
    kind: str
    shapes: tuple[str, ...]  # e.g. ("f32[12304,18944]",): the result per device
    bytes: int  # result bytes per device, one execution
    count: int  # executions per run of the program (trip counts of enclosing loops)
    computation: str
    elements: int  # result elements per device (all of its arrays)


def _elements(dims: str) -> int:
    return math.prod(int(x) for x in dims.split(",") if x)


def collectives(hlo_text: str) -> list[Collective]:
    """Every collective of a compiled program (`jax.jit(f).lower(...).compile().as_text()`),
    reachable from its entry; both branches of a conditional count (an upper bound)."""
    ops: dict[str, list[tuple[str, tuple[str, ...], int, int]]] = defaultdict(list)
    calls: dict[str, list[tuple[str, int]]] = defaultdict(list)  # computation -> (callee, times)
    entry = current = ""  # a bare list of instructions (no computation header) is its own entry
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = header.group(1)
            entry = current if line.startswith("ENTRY") else entry
            continue
        op = _OP.match(line)
        if op:
            arrays = _ARRAY.findall(op.group(1))
            if f"{op.group(2)}-start(" in line:  # async: (operands..., result); count the result
                arrays = arrays[-1:]
            shapes = tuple(f"{t}[{d}]" for t, d in arrays)
            size = int(sum(_BYTES.get(t, 4) * _elements(d) for t, d in arrays))
            ops[current].append((op.group(2), shapes, size, sum(_elements(d) for _, d in arrays)))
            continue
        loop = _WHILE.search(line)
        if loop:
            trips = _TRIPS.search(line)
            calls[current].append((loop.group(2), int(trips.group(1)) if trips else 1))
            continue
        for callee in _CALLS.findall(line):
            for name in callee.replace("%", "").split(","):
                if name.strip():
                    calls[current].append((name.strip(), 1))

    out: list[Collective] = []

    def visit(name: str, times: int, seen: tuple[str, ...]) -> None:
        if name in seen:
            return
        out.extend(Collective(kind, shapes, size, times, name, n) for kind, shapes, size, n in ops.get(name, ()))
        for callee, trips in calls.get(name, ()):
            visit(callee, times * trips, (*seen, name))

    visit(entry, 1, ())
    return out


def arrays(c: Collective) -> list[tuple[tuple[int, ...], int]]:
    """(dimensions, bytes) of each array a collective produces per device (e.g. an all-reduce
    of several gradients at once has one entry per gradient)."""
    out = []
    for shape in c.shapes:
        dtype, dims = _ARRAY.match(shape).groups()  # type: ignore[union-attr]
        out.append((tuple(int(x) for x in dims.split(",") if x), int(_BYTES.get(dtype, 4) * _elements(dims))))
    return out


def count(hlo_text: str) -> dict[str, int]:
    """Collective instructions by kind, each once per place that calls its computation
    (not executions: loops count once; both branches of a conditional count)."""
    out: dict[str, int] = {}
    for c in collectives(hlo_text):
        out[c.kind] = out.get(c.kind, 0) + 1
    return out


def total_bytes(ops: list[Collective], kind: str | None = None) -> int:
    """Bytes per device that the collectives (of `kind`, default all) produce in one run."""
    return sum(c.bytes * c.count for c in ops if kind is None or c.kind == kind)


def summary(ops: list[Collective]) -> dict[str, dict[str, int]]:
    """Per kind: how many executions and how many result bytes per device in one run."""
    out: dict[str, dict[str, int]] = {}
    for c in ops:
        row = out.setdefault(c.kind, {"executions": 0, "bytes": 0})
        row["executions"] += c.count
        row["bytes"] += c.bytes * c.count
    return out
