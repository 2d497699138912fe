"""`trainer bench --profile DIR`: a `jax.profiler` trace of the timed steps, and its costliest ops.

The trace goes to DIR as TensorBoard/XProf read it (`plugins/profile/<run>/*.xplane.pb`) and as a
Perfetto trace (`perfetto_trace.json.gz`, Chrome's trace-event JSON); the summary reads the latter,
so it needs nothing beyond the standard library. An accelerator's ops are the events of its
`/device:...` processes (their "XLA Ops" lines; the "XLA Modules" lines hold whole programs and are
counted apart); on a CPU-only host the compiled programs' work runs on the XLA client's threads of
`/host:CPU`, which are taken instead.

An op's time is its own (exclusive) time: a TPU's op line nests the ops a `while` or a `call` runs
inside that op's own event, so inclusive times would rank the decode loop, its layer loop and the
fusions inside them all at once, counting the same microseconds three times.
"""

from __future__ import annotations

import bisect
import contextlib
import gzip
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

MODULE_LINE = "XLA Modules"
"""The device line whose events are whole compiled programs (jit_step, ...), not ops."""
OPS_LINE = "XLA Ops"
"""The device line of the programs' ops; a device's other lines (steps, name scopes) are not ops."""
HOST_XLA = ("XLAPjRtCpuClient", "XLAEigen")
"""Thread names of XLA:CPU's workers: where a CPU-only host's compiled ops run."""


@dataclass(frozen=True)
class OpTime:
    name: str
    seconds: float
    count: int
    share: float
    """Of all op time on the lines summed."""
    detail: str
    """The op's HLO text where the trace gives it (`long_name`), else ''."""


@contextlib.contextmanager
def profiled(directory: Path | None) -> Iterator[None]:
    """A `jax.profiler` trace to `directory` of what runs inside; nothing when it is None."""
    if directory is None:
        yield
        return
    Path(directory).mkdir(parents=True, exist_ok=True)
    with jax.profiler.trace(str(directory), create_perfetto_trace=True):
        yield


def perfetto_file(directory: Path) -> Path:
    """The newest Perfetto trace under `directory` (a trace writes plugins/profile/<time>/...)."""
    found = sorted(Path(directory).rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"{directory}: no perfetto_trace.json.gz under it (was it traced with "
                                "trainer bench --profile?)")
    return found[-1]


def load_events(path: Path) -> list[dict[str, Any]]:
    data = json.loads(gzip.decompress(Path(path).read_bytes()))
    return data["traceEvents"] if isinstance(data, dict) else data


def own_times(events: Sequence[dict[str, Any]]) -> list[float]:
    """Each complete event's duration less its direct children's, the children being the events
    of its line (pid, tid) that start inside it (a `while` op and the ops of its body)."""
    own = [float(e.get("dur", 0.0)) for e in events]
    by_line: dict[tuple[Any, Any], list[int]] = {}
    for i, e in enumerate(events):
        by_line.setdefault((e["pid"], e.get("tid")), []).append(i)
    for indices in by_line.values():
        indices.sort(key=lambda i: (events[i].get("ts", 0.0), -float(events[i].get("dur", 0.0))))
        open_: list[tuple[float, int]] = []  # (end, index) of the events enclosing the current one
        for i in indices:
            start = float(events[i].get("ts", 0.0))
            while open_ and open_[-1][0] <= start:
                open_.pop()
            if open_:
                own[open_[-1][1]] -= float(events[i].get("dur", 0.0))
            open_.append((start + float(events[i].get("dur", 0.0)), i))
    return own


def op_times(events: Sequence[dict[str, Any]], top: int = 10) -> tuple[list[OpTime], dict[str, float]]:
    """(the `top` ops by total time, seconds of each compiled program) from trace events.

    Ops: complete events ("ph": "X") on a device's op lines, or, with no device in the trace, on
    XLA:CPU's worker threads. Durations are microseconds in the trace."""
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"]
               for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    devices = {pid for pid, name in processes.items() if name.startswith("/device:")}

    def line(e: dict[str, Any]) -> str:
        return threads.get((e["pid"], e.get("tid")), "")

    with_ops_line = {pid for (pid, _), name in threads.items() if pid in devices and name == OPS_LINE}

    def on_op_line(e: dict[str, Any]) -> bool:
        if "::" in e["name"]:  # the runtime's own spans (ThunkExecutor::Execute), which enclose ops
            return False
        if devices:
            if e["pid"] not in devices or line(e) == MODULE_LINE:
                return False
            return line(e) == OPS_LINE or e["pid"] not in with_ops_line
        # an XLA:CPU op names its program; the workers' other spans ("end: ...") do not
        return any(worker in line(e) for worker in HOST_XLA) and "hlo_module" in e.get("args", {})

    totals: dict[str, list[float]] = {}
    details: dict[str, str] = {}
    modules: dict[str, float] = {}
    runs: dict[Any, list[tuple[float, float, str]]] = {}  # each device's program runs: (start, end, name)
    ops = []
    for e in events:
        if e.get("ph") != "X":
            continue
        if e["pid"] in devices and line(e) == MODULE_LINE:
            modules[e["name"]] = modules.get(e["name"], 0.0) + e.get("dur", 0.0) / 1e6
            start = float(e.get("ts", 0.0))
            runs.setdefault(e["pid"], []).append((start, start + float(e.get("dur", 0.0)), e["name"]))
        elif on_op_line(e):
            ops.append(e)
    for line_runs in runs.values():
        line_runs.sort()

    def program_of(e: dict[str, Any]) -> str | None:
        """The program an op ran in: XLA:CPU names it on the op; a TPU's op line does not, so it is the
        program run on the device's module line that encloses the op (its name less the "(id)")."""
        if "hlo_module" in e.get("args", {}):
            return e["args"]["hlo_module"]
        line_runs, ts = runs.get(e["pid"], []), float(e.get("ts", 0.0))
        i = bisect.bisect_right(line_runs, (ts, math.inf, "")) - 1
        if i >= 0 and ts < line_runs[i][1]:
            return line_runs[i][2].split("(")[0]
        return None

    for e, own in zip(ops, own_times(ops)):
        # op names repeat across programs (fusion.3 of the update and of the rollout): name both
        program = program_of(e)
        name = f"{program}/{e['name']}" if program else e["name"]
        args = e.get("args", {})
        seconds_count = totals.setdefault(name, [0.0, 0])
        seconds_count[0] += own / 1e6
        seconds_count[1] += 1
        details.setdefault(name, str(args.get("long_name", "")))
    whole = sum(s for s, _ in totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
    ops = [OpTime(name, s, int(n), s / whole, details[name]) for name, (s, n) in ranked]
    return ops, modules


def summary_lines(ops: Sequence[OpTime], modules: dict[str, float], *, width: int = 100) -> list[str]:
    """The ops and programs as printable lines."""
    lines = [f"{'op':<40} {'seconds':>9} {'count':>6} {'share':>6}  hlo"]
    for op in ops:
        lines.append(f"{op.name[:40]:<40} {op.seconds:>9.4f} {op.count:>6} {op.share:>6.1%}  {op.detail[:width]}")
    for name, seconds in sorted(modules.items(), key=lambda kv: -kv[1])[:5]:
        lines.append(f"program {name}: {seconds:.4f} s")
    return lines


def summarise(directory: Path, top: int = 10) -> dict[str, Any]:
    """The trace under `directory` as JSON-ready top ops and programs."""
    path = perfetto_file(directory)
    ops, modules = op_times(load_events(path), top)
    return {"trace": str(path), "ops": [op.__dict__ for op in ops], "programs": modules,
            "lines": summary_lines(ops, modules)}
